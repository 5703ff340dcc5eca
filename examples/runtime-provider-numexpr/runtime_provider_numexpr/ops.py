"""The ONNX ops the numexpr provider fuses, each as a numexpr expression template.

An :class:`OpSpec` says which schema versions of an op the template implements
(the versions whose semantics are elementwise and identical), which dtypes its
data inputs may have, and the dtype of its output. ``build(args, attrs, const)``
returns the expression for the node from its inputs' expressions; ``const(value)``
gives the name of a 0-d constant of the node's data dtype (numexpr would turn a
literal ``0.5`` into float64 and promote a float32 expression with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

FLOATS = frozenset({"float32", "float64"})
INTS = frozenset({"int32", "int64"})
BOOL = frozenset({"bool"})


@dataclass(frozen=True)
class OpSpec:
    """One op: its expression template and the versions and dtypes it implements."""

    build: Callable[[list, Mapping, Callable], str]
    versions: tuple[int, ...]
    dtypes: frozenset
    output: str = "same"      # "same": the data dtype; "bool": a comparison
    condition: bool = False   # the first input is a bool condition (Where)
    arity: int = 1


def _unary(fn: str) -> Callable:
    return lambda a, attrs, c: f"{fn}({a[0]})"


def _binary(op: str) -> Callable:
    return lambda a, attrs, c: f"({a[0]} {op} {a[1]})"


_TRIG = {"Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "arcsin", "Acos": "arccos", "Atan": "arctan"}
_HYP = {"Sinh": "sinh", "Cosh": "cosh", "Asinh": "arcsinh", "Acosh": "arccosh", "Atanh": "arctanh"}

#: op type (default ONNX domain) -> spec
OPS: dict[str, OpSpec] = {
    "Add": OpSpec(_binary("+"), (7, 13, 14), FLOATS | INTS, arity=2),
    "Sub": OpSpec(_binary("-"), (7, 13, 14), FLOATS | INTS, arity=2),
    "Mul": OpSpec(_binary("*"), (7, 13, 14), FLOATS | INTS, arity=2),
    # integer Div truncates in ONNX; numexpr's integer '/' is true division
    "Div": OpSpec(_binary("/"), (7, 13, 14), FLOATS, arity=2),
    "Pow": OpSpec(_binary("**"), (7, 12, 13, 15), FLOATS, arity=2),
    "Neg": OpSpec(lambda a, attrs, c: f"(-{a[0]})", (6, 13), FLOATS | INTS),
    # numexpr's abs() of an integer returns float64
    "Abs": OpSpec(_unary("abs"), (6, 13), FLOATS),
    "Sqrt": OpSpec(_unary("sqrt"), (6, 13), FLOATS),
    "Exp": OpSpec(_unary("exp"), (6, 13), FLOATS),
    "Log": OpSpec(_unary("log"), (6, 13), FLOATS),
    "Tanh": OpSpec(_unary("tanh"), (6, 13), FLOATS),
    "Floor": OpSpec(_unary("floor"), (6, 13), FLOATS),
    "Ceil": OpSpec(_unary("ceil"), (6, 13), FLOATS),
    "Reciprocal": OpSpec(lambda a, attrs, c: f"({c(1)} / {a[0]})", (6, 13), FLOATS),
    "Sigmoid": OpSpec(lambda a, attrs, c: f"({c(1)} / ({c(1)} + exp(-{a[0]})))", (6, 13), FLOATS),
    # Relu-14 adds integer types; NaN < 0 is false, so NaN stays NaN
    "Relu": OpSpec(lambda a, attrs, c: f"where({a[0]} < {c(0)}, {c(0)}, {a[0]})", (6, 13, 14), FLOATS | INTS),
    "LeakyRelu": OpSpec(lambda a, attrs, c: f"where({a[0]} < {c(0)}, {a[0]} * {c(attrs['alpha'])}, {a[0]})",
                        (6, 16), FLOATS),
    "Elu": OpSpec(lambda a, attrs, c: f"where({a[0]} < {c(0)}, {c(attrs['alpha'])} * expm1({a[0]}), {a[0]})",
                  (6, 22), FLOATS),
    # log(1 + exp(x)) without the overflow of exp for large x
    "Softplus": OpSpec(lambda a, attrs, c: f"where({a[0]} > {c(30)}, {a[0]}, log1p(exp({a[0]})))", (1, 22), FLOATS),
    "Greater": OpSpec(_binary(">"), (7, 9, 13), FLOATS | INTS, "bool", arity=2),
    "Less": OpSpec(_binary("<"), (7, 9, 13), FLOATS | INTS, "bool", arity=2),
    "GreaterOrEqual": OpSpec(_binary(">="), (12, 16), FLOATS | INTS, "bool", arity=2),
    "LessOrEqual": OpSpec(_binary("<="), (12, 16), FLOATS | INTS, "bool", arity=2),
    "Equal": OpSpec(_binary("=="), (7, 11, 13, 19), FLOATS | INTS | BOOL, "bool", arity=2),
    "And": OpSpec(_binary("&"), (7,), BOOL, "bool", arity=2),
    "Or": OpSpec(_binary("|"), (7,), BOOL, "bool", arity=2),
    "Not": OpSpec(lambda a, attrs, c: f"(~{a[0]})", (1,), BOOL, "bool"),
    "Where": OpSpec(lambda a, attrs, c: f"where({a[0]}, {a[1]}, {a[2]})", (9, 16), FLOATS | INTS,
                    condition=True, arity=3),
}
# version 22 of these only added float16/bfloat16, which this provider declines
OPS.update({op: OpSpec(_unary(fn), (7, 22), FLOATS) for op, fn in _TRIG.items()})
OPS.update({op: OpSpec(_unary(fn), (9, 22), FLOATS) for op, fn in _HYP.items()})

#: ops computed with a transcendental function (numexpr's are scalar unless it uses Intel VML)
TRANSCENDENTAL = frozenset({"Pow", "Exp", "Log", "Tanh", "Sigmoid", "Elu", "Softplus", *_TRIG, *_HYP})
