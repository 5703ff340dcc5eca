"""Exporting a torch module the way users do: TorchScript or dynamo exporter, a given opset,
static or dynamic axes; random weights initialised as the architectures' own code does."""

from __future__ import annotations

import warnings
from pathlib import Path


def export(module, args: tuple, path: Path, *, inputs: list, outputs: list, exporter: str, opset: int,
           dynamic: dict | None = None) -> None:
    """``torch.onnx.export`` of ``module`` in eval mode to ``path``. ``exporter``: ``"torchscript"``
    (``dynamo=False``) or ``"dynamo"``; ``dynamic``: input or output name -> {axis: name}, or
    None for static shapes."""
    import logging

    import torch

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" notes
    module.eval()
    kw = dict(opset_version=opset, input_names=inputs, output_names=outputs)
    if dynamic:
        kw["dynamic_axes"] = dynamic
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(module, args, str(path), dynamo=False, do_constant_folding=True, **kw)
        elif exporter == "dynamo":
            prog = torch.onnx.export(module, args, dynamo=True, verbose=False, **kw)
            prog.save(str(path))  # one file: the corpus models are far under protobuf's 2 GiB
        else:
            raise ValueError(f"exporter must be 'torchscript' or 'dynamo', got {exporter!r}")


def init_transformer(module, std: float = 0.02, seed: int = 0) -> None:
    """BERT / GPT-2 / T5 style initialisation: normal(0, std) matrices and embeddings, zero biases,
    unit norms (torch's defaults would leave some layers far from what trained models look like)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * std)
            else:  # norm weights
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)


def randomize_bn(module, seed: int = 1) -> None:
    """BatchNorm running statistics and affine parameters away from the identity (fresh ones
    would fold into nothing and hide mistakes in the fused conv + BN)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(1.0 + torch.randn(m.num_features, generator=g) * 0.1)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
