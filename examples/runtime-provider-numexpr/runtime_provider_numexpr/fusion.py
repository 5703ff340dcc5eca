"""A claimed partition becomes a few numexpr programs, each one pass over memory.

Every node of the partition is elementwise, so a value read by exactly one node
of the partition is inlined into that node's expression: a chain
``Add -> Mul -> Tanh -> Relu`` is one program, with no temporaries between nodes.
A value is *materialized* (computed by its own program and kept) when it is an
output of the partition or is read by more than one node, and also when an
expression would get too many operands or too deep for numexpr.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .ops import OPS

#: numexpr runs at most this many distinct operands in one program (numpy's iterator limit)
MAX_OPERANDS = 24
#: expressions nest no deeper (Python's parser, which numexpr uses, limits nesting)
MAX_DEPTH = 40

_KIND = {"bool": bool, "int32": np.int32, "int64": np.int64, "float32": float, "float64": np.float64}


@dataclass(frozen=True)
class _Expr:
    text: str
    leaves: frozenset   # env keys this expression reads
    depth: int


@dataclass(frozen=True)
class Program:
    """One numexpr program: reads ``args`` (env keys) and writes ``out``."""

    expression: str
    args: tuple
    out: str
    dtype: np.dtype
    compiled: Any


class FusedExecutable:
    """The compiled form of a partition: numexpr programs in order. Keeps no state between runs."""

    def __init__(self, partition):
        import numexpr

        self.inputs = tuple(partition.inputs)
        self.outputs = tuple(partition.outputs)
        self.env: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in partition.constants.items()}
        self._dtypes: dict[str, np.dtype] = {k: v.dtype for k, v in self.env.items()}
        for name in self.inputs:
            self._dtypes[name] = np.dtype(partition.value(name).dtype)
        self._var: dict[str, str] = {}
        self._numexpr = numexpr
        self.programs: list[Program] = []
        outputs = set(self.outputs)
        readers: dict[str, int] = {}
        for node in partition.nodes:
            for i in node.inputs:
                readers[i] = readers.get(i, 0) + 1
        exprs: dict[str, _Expr] = {}

        def expr_of(name: str) -> _Expr:
            return exprs.get(name) or self._leaf(name)

        for node in partition.nodes:
            spec = OPS[node.op_type]
            args = [expr_of(i) for i in node.inputs]
            if (len(frozenset().union(*(a.leaves for a in args))) > MAX_OPERANDS - 4
                    or max(a.depth for a in args) >= MAX_DEPTH):
                for i in node.inputs:
                    if i in exprs and exprs[i].depth > 0:
                        exprs[i] = self._materialize(i, exprs[i])
                args = [expr_of(i) for i in node.inputs]
            data = node.input_info[1 if spec.condition else 0]
            consts: set[str] = set()

            def const(value, _dtype=np.dtype(data.dtype), _used=consts) -> str:
                key = self._constant(np.asarray(value, _dtype))
                _used.add(key)
                return self._var[key]

            text = spec.build([a.text for a in args], node.attrs, const)
            out = node.outputs[0]
            self._dtypes[out] = np.dtype(node.output_info[0].dtype)
            e = _Expr(text, frozenset().union(*(a.leaves for a in args), consts),
                      1 + max(a.depth for a in args))
            exprs[out] = e
            if out in outputs or readers.get(out, 0) > 1:
                exprs[out] = self._materialize(out, e)

    def _leaf(self, key: str) -> _Expr:
        if key not in self._var:
            self._var[key] = f"v{len(self._var)}"
        return _Expr(self._var[key], frozenset({key}), 0)

    def _constant(self, value: np.ndarray) -> str:
        key = f"__const_{value.dtype.name}_{value.item()!r}"
        if key not in self.env:
            self.env[key] = value
            self._dtypes[key] = value.dtype
        self._leaf(key)
        return key

    def _materialize(self, name: str, e: _Expr) -> _Expr:
        args = tuple(sorted(e.leaves, key=lambda k: int(self._var[k][1:])))
        signature = [(self._var[k], _KIND[self._dtypes[k].name]) for k in args]
        compiled = self._numexpr.NumExpr(e.text, signature=signature)
        want = self._dtypes[name]
        probe = compiled(*(np.zeros((1,), self._dtypes[k]) for k in args))
        if probe.dtype != want:  # a template bug, never a silent cast
            raise RuntimeError(f"numexpr program {e.text!r} computes {probe.dtype}, "
                               f"but {name!r} is {want}")
        self.programs.append(Program(e.text, args, name, want, compiled))
        return self._leaf(name)

    def run(self, inputs: list) -> list:
        """Inputs in ``partition.inputs`` order; outputs in ``partition.outputs`` order."""
        env = dict(self.env)
        env.update(zip(self.inputs, inputs))
        for p in self.programs:
            env[p.out] = p.compiled(*(env[k] for k in p.args))
        return [env[o] for o in self.outputs]

    def describe(self) -> list[str]:
        """One line per program: ``out = expression`` with the operands' value names."""
        names = {v: k for k, v in self._var.items()}
        lines = []
        for p in self.programs:
            text = p.expression
            for var in sorted((self._var[k] for k in p.args), key=lambda v: -int(v[1:])):
                text = text.replace(var, names[var])
            lines.append(f"{p.out} = {text}")
        return lines
