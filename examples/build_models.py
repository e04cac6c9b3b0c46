"""Writes the model files of the example repository (`make examples`): TorchScript, and the MLP again as
PyTorch 2 exports it (an ExportedProgram, `model.pt2`). Configs are committed, weights are built, so the
repository holds no binaries."""

import sys
from pathlib import Path
from typing import List

import torch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))

    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.layers(INPUT0), dim=-1)


class Lengths(torch.nn.Module):
    def forward(self, TEXT: List[str]) -> torch.Tensor:
        return torch.tensor([len(t) for t in TEXT], dtype=torch.int64).reshape(-1, 1)


class HalfPlusThree(torch.nn.Module):
    """TF Serving's toy model, y = 0.5·x + 3, so its REST example session replays here."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x + 3


class Sentiment(torch.nn.Module):
    """A linear scorer over 8 features: what a SageMaker PyTorch user would ship as model.pt."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(x), dim=-1)


def main(root: Path) -> None:
    torch.manual_seed(0)
    builds = {"mlp/1/model.pt": MLP(), "lengths/1/model.pt": Lengths(), "sentiment/model.pt": Sentiment(),
              "half_plus_three/123/model.pt": HalfPlusThree()}
    for relative, module in builds.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.jit.script(module).save(str(path))
        print(f"wrote {path}")
    exported = root / "mlp_export/1/model.pt2"
    exported.parent.mkdir(parents=True, exist_ok=True)
    rows = torch.export.Dim("rows", min=1, max=1024)  # a dynamic first dimension: the server may batch it
    torch.export.save(torch.export.export(builds["mlp/1/model.pt"].eval(), (torch.zeros(2, 4),),
                                          dynamic_shapes={"INPUT0": {0: rows}}), exported)
    print(f"wrote {exported}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "models"))
