"""KServe's own clients, every call a KServe user makes, run by test_kserve.py in a process of its own:
kserve's protobuf module declares Triton's `inference` package again, and one process cannot hold it
beside tritonclient's. `python kserve_calls.py HTTP_URL GRPC_HOST:PORT MODEL` prints what each call
returned (or the error it raised) as one JSON object."""

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput

X = np.arange(8, dtype=np.float32).reshape(2, 4)


def tensor(binary: bool) -> InferInput:
    x = InferInput("x", [2, 4], "FP32")
    x.set_data_from_numpy(X, binary_data=binary)
    return x


async def outcome(call) -> object:
    """What a call returned, or its error's class and words."""
    try:
        return await call
    except Exception as exc:  # the clients raise their own kinds; the test reads class and words
        return {"error": type(exc).__name__, "message": str(exc)[:500]}


async def v2_calls(url: str, model: str) -> dict:
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0))
    try:
        requests = {
            "json": InferRequest(model, [tensor(False)]),
            "binary_inputs": InferRequest(model, [tensor(True)]),
            "binary_output": InferRequest(model, [tensor(False)], request_outputs=[RequestedOutput("y", {"binary_data": True})]),
            "binary_data_output": InferRequest(model, [tensor(True)], parameters={"binary_data_output": True}),
        }
        results = {"live": await outcome(client.is_server_live(url)), "ready": await outcome(client.is_server_ready(url)),
                   "model_ready": await outcome(client.is_model_ready(url, model)),
                   "unknown_ready": await outcome(client.is_model_ready(url, "no_such_model"))}
        for name, request in requests.items():
            answer = await outcome(client.infer(url, request, model_name=model))
            results[name] = answer if isinstance(answer, dict) else answer.outputs[0].as_numpy().tolist()
        results["unknown"] = await outcome(client.infer(url, InferRequest("no_such_model", [tensor(False)]),
                                                        model_name="no_such_model"))
        return results
    finally:
        await client.close()


async def v1_calls(url: str, model: str) -> dict:
    client = InferenceRESTClient(RESTConfig(protocol="v1", retries=0))
    try:
        return {"live": await outcome(client.is_server_live(url)), "model_ready": await outcome(client.is_model_ready(url, model)),
                "predict": await outcome(client.infer(url, {"instances": X.tolist()}, model_name=model)),
                "unknown": await outcome(client.infer(url, {"instances": X.tolist()}, model_name="no_such_model"))}
    finally:
        await client.close()


async def grpc_calls(url: str, model: str) -> dict:
    client = InferenceGRPCClient(url)  # its own default channel options and retry policy
    try:
        typed = InferInput("x", [2, 4], "FP32", data=X.ravel().tolist())  # typed contents, not raw
        results = {"live": await outcome(client.is_server_live()), "ready": await outcome(client.is_server_ready()),
                   "model_ready": await outcome(client.is_model_ready(model))}
        for name, request in (("raw", InferRequest(model, [tensor(True)])), ("typed", InferRequest(model, [typed]))):
            answer = await outcome(client.infer(request))
            results[name] = answer if isinstance(answer, dict) else answer.outputs[0].as_numpy().tolist()
        results["unknown"] = await outcome(client.infer(InferRequest("no_such_model", [tensor(True)])))
        return results
    finally:
        await client.close()


async def main(http_url: str, grpc_url: str, model: str) -> None:
    results = {"v2": await v2_calls(http_url, model), "v1": await v1_calls(http_url, model),
               "grpc": await grpc_calls(grpc_url, model)}
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
