"""Run benchmark scenarios and print their tables as Markdown (for BENCHMARKS.md).

    python -m bench [tiny mlp grpc frontends payload churn cold_load memory handler soak s3_load attacks classification burst python_backend pt2 handler_pool gpu response_cache chaos flood fidelity perf_analyzer] [--seconds N] [--smoke]

--smoke runs everything briefly on small models: the test suite does that so the scripts cannot rot;
its numbers mean nothing.
"""

import argparse
import importlib
import platform

import torch

from container import resources

SCENARIOS = ("tiny", "mlp", "grpc", "frontends", "payload", "churn", "cold_load", "memory", "handler", "soak", "s3_load", "attacks", "classification",
             "burst", "python_backend", "pt2", "handler_pool", "gpu", "response_cache", "chaos", "flood", "fidelity",
             "perf_analyzer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", metavar="scenario", help=f"any of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--seconds", type=float, default=10, help="duration of each load measurement")
    parser.add_argument("--smoke", action="store_true", help="a quick run that checks the scripts, not the speed")
    arguments = parser.parse_args()
    unknown = sorted(set(arguments.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    seconds = 1 if arguments.smoke else arguments.seconds
    print(f"Machine: {platform.machine()}, {resources.cpu_quota()} cores, torch {torch.__version__}.\n")
    for name in arguments.scenarios or SCENARIOS:
        scenario = importlib.import_module(f"bench.{name}")
        print(f"## {scenario.TITLE}\n\n`python -m bench {name}`\n")
        print("\n".join(scenario.run(seconds, arguments.smoke)) + "\n", flush=True)


if __name__ == "__main__":
    main()
