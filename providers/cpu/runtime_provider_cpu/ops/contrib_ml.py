"""CPU kernels: the ``com.microsoft`` ops that scikit-learn converters emit (CDist, MurmurHash3,
Tokenizer), as onnxruntime's contrib kernels define them.

These ops have no onnx schema: attributes arrive as the node wrote them, so the defaults
below are onnxruntime's schema defaults (``contrib_defs.cc``), and required ones are checked.

* CDist: ``|a|^2 + |b|^2 - 2 a.b`` in the input dtype, then ``abs`` (and ``sqrt`` for
  ``euclidean``), the order onnxruntime adds the terms in; metrics ``sqeuclidean`` (default) and
  ``euclidean`` only, as onnxruntime.
* MurmurHash3: x86 32-bit MurmurHash3 of each element's bytes (a 4-byte int32/uint32, or a
  string's UTF-8 bytes) with ``seed``; ``positive=1`` (default) gives uint32, 0 int32.
* Tokenizer: onnxruntime's separator / token-expression / character tokenization with
  ``mark`` (0x02 and 0x03 around each row's tokens), padding with ``pad_value`` after them, and
  ``mincharnum``. Regular expressions are RE2 in onnxruntime, run leftmost-longest; here Python's
  ``re`` with RE2's ASCII classes (``strings._compile_re2``), which finds the same matches when a
  pattern has no alternation and no lazy quantifier: patterns with either are declined.
"""

from __future__ import annotations

import re

import numpy as np

from ..registry import kernel
from .strings import _compile_re2
from ._common import ignore_fp

MS = "com.microsoft"

# -- CDist --------------------------------------------------------------------------------

_CDIST_METRICS = ("sqeuclidean", "euclidean")


def _check_cdist(node):
    metric = node.attrs.get("metric", "sqeuclidean")
    if metric not in _CDIST_METRICS:
        return f"CDist: metric {metric!r} is not supported (onnxruntime has {', '.join(_CDIST_METRICS)})"
    return None


@kernel("CDist", 1, domain=MS, check=_check_cdist, dtypes={"float32", "float64"})
def cdist(ctx, a, b, *, metric="sqeuclidean"):
    """Pairwise distances between the rows of ``a`` (m, k) and ``b`` (n, k): (m, n)."""
    if a.ndim != 2 or a.shape[1] <= 0:
        raise ValueError(f"CDist: the first input must be 2-D with a positive second dim, got shape {a.shape}")
    if b.ndim != 2:
        raise ValueError(f"CDist: the second input must be 2-D, got shape {b.shape}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"CDist: inputs have {a.shape[1]} and {b.shape[1]} columns; they must be equal")
    if b.dtype != a.dtype:
        raise ValueError(f"CDist: inputs have dtypes {a.dtype} and {b.dtype}; they must be equal")
    a_ss = np.einsum("ij,ij->i", a, a)
    b_ss = np.einsum("ij,ij->i", b, b)
    out = (a @ b.T) * a.dtype.type(-2)
    out += a_ss[:, None]
    out += b_ss[None, :]
    np.abs(out, out=out)  # the GEMM form may leave tiny negatives where the distance is zero
    if metric == "euclidean":
        np.sqrt(out, out=out)
    return out


# -- MurmurHash3 --------------------------------------------------------------------------

_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)


def _rotl(x, r: int):
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _fmix(h):
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def _mix_block(h, k):
    k = _rotl(k * _C1, 15) * _C2
    h = h ^ k
    return _rotl(h, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _murmur_words(words: np.ndarray, seed: int) -> np.ndarray:
    """MurmurHash3_x86_32 of each 4-byte key (``words`` uint32, any shape), vectorized."""
    with ignore_fp(over="ignore"):
        h = _mix_block(np.full(words.shape, seed & 0xFFFFFFFF, np.uint32), words)
        h ^= np.uint32(4)
        return _fmix(h)


def _murmur_bytes(data: bytes, seed: int) -> int:
    """MurmurHash3_x86_32 of one byte string (little-endian blocks, as onnxruntime on x86)."""
    n = len(data)
    nblocks = n // 4
    with ignore_fp(over="ignore"):
        h = np.uint32(seed & 0xFFFFFFFF)
        for k in np.frombuffer(data, "<u4", nblocks):
            h = _mix_block(h, k)
        tail = data[nblocks * 4:]
        if tail:
            k1 = np.uint32(int.from_bytes(tail, "little"))
            h ^= _rotl(k1 * _C1, 15) * _C2
        h ^= np.uint32(n & 0xFFFFFFFF)
        return int(_fmix(np.uint32(h)))


def _check_murmur(node):
    info = node.input_info[0] if node.input_info else None
    dt = getattr(info, "dtype", None)
    if dt is not None and np.dtype(dt).name not in ("int32", "uint32", "object"):
        return f"MurmurHash3: input dtype {np.dtype(dt).name} is not supported (int32, uint32, string)"
    return None


@kernel("MurmurHash3", 1, domain=MS, check=_check_murmur)
def murmur_hash3(ctx, x, *, seed=0, positive=1):
    out_dtype = np.uint32 if positive else np.int32
    if x.dtype == object:
        flat = [_murmur_bytes(str(s).encode("utf-8"), seed) for s in x.reshape(-1)]
        return np.array(flat, np.uint32).reshape(x.shape).view(out_dtype)
    if x.dtype not in (np.int32, np.uint32):
        raise ValueError(f"MurmurHash3: input dtype {x.dtype} is not supported (int32, uint32, string)")
    words = np.ascontiguousarray(x).view(np.uint32)
    return _murmur_words(words, seed).view(out_dtype)


# -- Tokenizer ----------------------------------------------------------------------------

_START, _END = "\x02", "\x03"


def _leftmost_longest_reason(pattern: str) -> str | None:
    """Why ``re``'s leftmost-first search may differ from RE2's leftmost-longest, or None."""
    try:
        parsed = re._parser.parse(pattern) if hasattr(re, "_parser") else __import__("sre_parse").parse(pattern)
    except re.error:
        return None  # _compile_re2 words the error
    stack = [parsed]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)) or type(v).__name__ == "SubPattern":
            for item in (v.data if type(v).__name__ == "SubPattern" else v):
                if isinstance(item, tuple) and len(item) == 2 and str(item[0]) in ("BRANCH", "MIN_REPEAT"):
                    what = "alternation" if str(item[0]) == "BRANCH" else "a lazy quantifier"
                    return (f"Tokenizer: pattern {pattern!r} uses {what}; onnxruntime's RE2 takes the longest "
                            "match there, which Python's re does not reproduce")
                stack.append(item)
    return None


def _tokenizer_regexes(separators, tokenexp):
    """(compiled separators, compiled tokenexp, char tokenization) or raise ValueError."""
    if separators is not None:
        if not separators:
            raise ValueError("Tokenizer: separators must not be empty")
        if len(separators) == 1 and separators[0] == "":
            return [], None, True
        seps = []
        for sep in separators:
            rx, reason = _compile_re2(sep)
            reason = reason or _leftmost_longest_reason(sep)
            if reason:
                raise ValueError(f"Tokenizer: cannot use separator {sep!r}: {reason}")
            seps.append(rx)
        return seps, None, False
    if tokenexp is None:
        raise ValueError("Tokenizer: either the separators or the tokenexp attribute is required")
    if not tokenexp:
        raise ValueError("Tokenizer: tokenexp must not be empty")
    if tokenexp == ".":
        return [], None, True
    rx, reason = _compile_re2(tokenexp)
    reason = reason or _leftmost_longest_reason(tokenexp)
    if reason:
        raise ValueError(f"Tokenizer: cannot use tokenexp {tokenexp!r}: {reason}")
    return [], rx, False


def _check_tokenizer(node):
    a = node.attrs
    for req in ("mark", "pad_value", "mincharnum"):
        if a.get(req) is None:
            return f"Tokenizer: the required attribute {req} is missing"
    if a["mincharnum"] <= 0:
        return "Tokenizer: mincharnum must be positive"
    try:
        _, _, char = _tokenizer_regexes(a.get("separators"), a.get("tokenexp"))
    except ValueError as exc:
        return str(exc)
    if char and a["mincharnum"] >= 2:
        return "Tokenizer: mincharnum is too big for character tokenization"
    return None


def _split(text: str, rx, mincharnum: int) -> list[str]:
    """Pieces of ``text`` between matches of separator ``rx`` with at least ``mincharnum`` chars."""
    out, start, end = [], 0, len(text)
    while start <= end:
        m = rx.search(text, start)
        if m is None:
            if end - start >= mincharnum:
                out.append(text[start:])
            break
        if m.start() - start >= mincharnum:
            out.append(text[start:m.start()])
        # an empty match skips the character it sits on, as onnxruntime does
        start = m.end() if m.end() > m.start() else m.start() + 1
    return out


def _tokens_of(text: str, seps, rx, mincharnum: int) -> list[str]:
    if seps:
        row = [text]
        for sep in seps:
            row = [t for piece in row for t in _split(piece, sep, mincharnum)]
            if not row:
                break
        return row
    if len(text) < mincharnum:
        return []
    row, start = [], 0
    while start <= len(text):
        m = rx.search(text, start)
        if m is None:
            break
        if m.end() - m.start() >= mincharnum:
            row.append(m.group(0))
            start = m.end()
        else:
            start = m.start() + 1
    return row


@kernel("Tokenizer", 1, domain=MS, check=_check_tokenizer, dtypes={"object"})
def tokenizer(ctx, x, *, mark=None, pad_value=None, mincharnum=None, separators=None, tokenexp=None):
    if mark is None or pad_value is None or mincharnum is None:
        raise ValueError("Tokenizer: the attributes mark, pad_value and mincharnum are required")
    if x.ndim not in (1, 2):
        raise ValueError(f"Tokenizer: input dimensions are either [C] or [N][C], got shape {x.shape}")
    if x.size == 0:
        return np.empty((x.shape[0], 0) if x.ndim == 2 else (0,), dtype=object)
    compiled = ctx.cache.get("rx")
    if compiled is None:
        compiled = ctx.cache["rx"] = _tokenizer_regexes(separators, tokenexp)
    seps, rx, char = compiled
    rows = []
    for s in x.reshape(-1):
        s = s.decode("utf-8") if isinstance(s, bytes) else str(s)
        rows.append(list(s) if char else _tokens_of(s, seps, rx, mincharnum))
    width = max(len(r) for r in rows)
    if width == 0:
        return np.empty(x.shape + (0,), dtype=object)
    marks = 2 if mark else 0
    out = np.full((len(rows), width + marks), pad_value, dtype=object)
    for i, r in enumerate(rows):
        if mark:
            out[i, 0] = _START
            out[i, len(r) + 1] = _END
        out[i, marks // 2:marks // 2 + len(r)] = r
    return out.reshape(x.shape + (width + marks,))
