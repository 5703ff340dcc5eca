"""CPU kernels: ``ai.onnx.ml`` label and category mapping (LabelEncoder, CategoryMapper) and
maps (ZipMap, DictVectorizer, CastMap)."""

from __future__ import annotations

import numpy as np

from ...registry import kernel
from ._common import ML, _F32, _strings_out


def _numeric_lookup(keys: np.ndarray, values: np.ndarray, x: np.ndarray, default, out_dtype,
                    first_wins=True, nan_key=True) -> np.ndarray:
    """Map ``x`` through ``keys -> values``; absent keys get ``default``."""
    flat = x.reshape(-1)
    keys = np.asarray(keys)
    if keys.size == 0:
        out = np.empty(flat.size, dtype=out_dtype)
        out[:] = default
        return out.reshape(x.shape)
    order = np.arange(keys.size)
    if not first_wins:
        order = order[::-1]
    k2 = keys[order]
    u, first = np.unique(k2, return_index=True)
    vals = np.asarray(values, dtype=out_dtype if out_dtype != object else object)[order][first]
    if u.dtype.kind == "f":
        nan_mask_u = np.isnan(u)
        nan_val = vals[nan_mask_u][0] if (nan_key and nan_mask_u.any()) else None
        u, vals = u[~nan_mask_u], vals[~nan_mask_u]
    else:
        nan_val = None
    fx = flat.astype(u.dtype) if flat.dtype != u.dtype else flat
    if u.size:
        j = np.searchsorted(u, fx)
        jc = np.minimum(j, u.size - 1)
        found = (j < u.size) & (u[jc] == fx)
    else:
        jc = np.zeros(flat.size, dtype=np.intp)
        found = np.zeros(flat.size, dtype=bool)
    out = np.empty(flat.size, dtype=out_dtype)
    out[:] = default
    if found.any():
        out[found] = vals[jc[found]]
    if nan_val is not None and flat.dtype.kind == "f":
        out[np.isnan(flat)] = nan_val
    return out.reshape(x.shape)


def _string_lookup(mapping: dict, x: np.ndarray, default, out_dtype) -> np.ndarray:
    flat = x.reshape(-1).tolist()
    if out_dtype == object:
        out = np.empty(len(flat), dtype=object)
        out[:] = [mapping.get(v, default) for v in flat]
    else:
        out = np.fromiter((mapping.get(v, default) for v in flat), dtype=out_dtype, count=len(flat))
    return out.reshape(x.shape)


def _first_wins_dict(keys, values) -> dict:
    d = {}
    for k_, v_ in zip(keys, values):
        d.setdefault(k_, v_)
    return d


@kernel("LabelEncoder", 1, domain=ML, dtypes={"int64", "object"})
def label_encoder_1(ctx, X, *, classes_strings, default_int64, default_string):
    classes = list(classes_strings or [])
    if X.dtype == object:
        d = {c: i for i, c in enumerate(classes)}  # the last occurrence wins
        return _string_lookup(d, X, int(default_int64), np.int64)
    xi = X.astype(np.int64, copy=False)
    ok = (xi >= 0) & (xi < len(classes))
    cls = _strings_out(classes) if classes else np.empty(0, dtype=object)
    out = np.empty(X.shape, dtype=object)
    out[...] = default_string
    if ok.any():
        out[ok] = cls[xi[ok]]
    return out


_LE_TYPES = {"strings": object, "int64s": np.int64, "floats": _F32}


def _le_value_kind(attrs, out_dtype):
    """Which values_* attribute (and output dtype) a LabelEncoder-2 node uses."""
    present = [s for s in ("strings", "int64s", "floats") if attrs.get(f"values_{s}") is not None]
    if out_dtype is not None:
        od = np.dtype(out_dtype)
        for s in present:
            if np.dtype(_LE_TYPES[s]) == od:
                return s
    if len(present) == 1:
        return present[0]
    if out_dtype is not None:
        od = np.dtype(out_dtype)
        for s, t in _LE_TYPES.items():
            if np.dtype(t) == od:
                return s
    raise ValueError("LabelEncoder: cannot tell which values_* attribute to use")


def _le_key_kind(x_dtype):
    if x_dtype == object:
        return "strings"
    if x_dtype.kind in "iu":
        return "int64s"
    return "floats"


def _le2_default(attrs, vkind):
    if vkind == "strings":
        return attrs.get("default_string")
    if vkind == "int64s":
        return attrs.get("default_int64")
    return attrs.get("default_float")


def _apply_label_map(keys, values, X, default, out_dtype):
    if X.dtype == object:
        d = _first_wins_dict(list(keys), list(values))
        return _string_lookup(d, X, default, out_dtype)
    return _numeric_lookup(np.asarray(keys), np.asarray(values, dtype=out_dtype), X, default, out_dtype)


@kernel("LabelEncoder", 2, domain=ML, dtypes={"int64", "object", "float32"})
def label_encoder_2(ctx, X, **attrs):
    kk = _le_key_kind(X.dtype)
    vk = _le_value_kind(attrs, ctx.output_dtypes[0] if ctx.output_dtypes else None)
    keys = attrs.get(f"keys_{kk}") or []
    values = attrs.get(f"values_{vk}") or []
    if len(keys) != len(values):
        raise ValueError(f"LabelEncoder: keys_{kk} has {len(keys)} entries, values_{vk} {len(values)}")
    out_dtype = _LE_TYPES[vk]
    if kk == "floats":
        keys = np.asarray(keys, dtype=_F32)
    elif kk == "int64s":
        keys = np.asarray(keys, dtype=np.int64)
    if vk == "floats":
        values = np.asarray(values, dtype=_F32)
    return _apply_label_map(keys, values, X, _le2_default(attrs, vk), out_dtype)


def _le4_keys(attrs, x_dtype):
    t = attrs.get("keys_tensor")
    if t is not None:
        return np.asarray(t).reshape(-1)
    if x_dtype == object:
        return np.asarray(attrs.get("keys_strings") or [], dtype=object)
    if x_dtype.kind == "f":
        return np.asarray(attrs.get("keys_floats") or [], dtype=x_dtype)
    return np.asarray(attrs.get("keys_int64s") or [], dtype=x_dtype)


def _le4_values(attrs, out_dtype):
    t = attrs.get("values_tensor")
    if t is not None:
        v = np.asarray(t).reshape(-1)
        return v, np.dtype(object) if v.dtype.kind in "OUS" else v.dtype
    kinds = [s for s in ("strings", "int64s", "floats") if attrs.get(f"values_{s}") is not None]
    if out_dtype is not None:
        od = np.dtype(out_dtype)
        pick = None
        for s in kinds:
            if (s == "strings") == (od == object) and (s == "floats") == (od.kind == "f"):
                pick = s
                break
        if pick is None and kinds:
            pick = kinds[0]
        dt = od
    else:
        if len(kinds) != 1:
            raise ValueError("LabelEncoder: cannot tell which values_* attribute to use")
        pick = kinds[0]
        dt = np.dtype(_LE_TYPES[pick])
    if pick is None:
        return np.zeros(0, dtype=dt), dt
    vals = attrs.get(f"values_{pick}")
    return (np.asarray(vals, dtype=object) if dt == object else np.asarray(vals).astype(dt)), dt


def _le4_default(attrs, dt):
    t = attrs.get("default_tensor")
    if t is not None:
        v = np.asarray(t).reshape(-1)
        if v.size:
            x = v[0]
            return str(x) if dt == object and not isinstance(x, str) else x
    if dt == object:
        return attrs.get("default_string")
    if dt == np.int64:
        return attrs.get("default_int64")
    if dt.kind == "f":
        return attrs.get("default_float")
    return -1


@kernel("LabelEncoder", 4, domain=ML, dtypes={"int64", "object", "float32", "float64", "int32", "int16"})
def label_encoder_4(ctx, X, **attrs):
    st = ctx.cache.get("le4")
    if st is None:
        keys = _le4_keys(attrs, X.dtype)
        values, dt = _le4_values(attrs, ctx.output_dtypes[0] if ctx.output_dtypes else None)
        if keys.size != values.size:
            raise ValueError(f"LabelEncoder: {keys.size} keys but {values.size} values")
        if X.dtype == object:
            keys = np.asarray([k if isinstance(k, str) else (k.decode() if isinstance(k, bytes) else str(k))
                               for k in keys.tolist()], dtype=object)
        else:
            keys = keys.astype(X.dtype)
        default = _le4_default(attrs, dt)
        if dt == object and isinstance(default, bytes):
            default = default.decode()
        if dt == object:
            values = np.asarray([v.decode() if isinstance(v, bytes) else v for v in values.tolist()],
                                dtype=object)
        st = (keys, values, default, dt)
        ctx.cache["le4"] = st
    keys, values, default, dt = st
    return _apply_label_map(keys, values, X, default, dt)


@kernel("CategoryMapper", 1, domain=ML, dtypes={"int64", "object"})
def category_mapper(ctx, X, *, cats_int64s, cats_strings, default_int64, default_string):
    ints = list(cats_int64s or [])
    strs = list(cats_strings or [])
    if len(ints) != len(strs):
        raise ValueError("CategoryMapper: cats_int64s and cats_strings differ in length")
    if X.dtype == object:
        d = _first_wins_dict(strs, ints)
        return _string_lookup(d, X, int(default_int64), np.int64)
    vals = _strings_out(strs) if strs else np.empty(0, dtype=object)
    return _numeric_lookup(np.asarray(ints, dtype=np.int64), vals, X.astype(np.int64, copy=False),
                           default_string, object)


# ---------------------------------------------------------------------------
# maps and sequences
# ---------------------------------------------------------------------------


@kernel("ZipMap", 1, domain=ML, dtypes={"float32"})
def zipmap(ctx, X, *, classlabels_int64s, classlabels_strings):
    got = ctx.cache.get("zipmap")
    if got is None:
        if bool(classlabels_int64s) == bool(classlabels_strings):
            raise ValueError("ZipMap: give classlabels_strings or classlabels_int64s (not both)")
        keys = list(classlabels_strings) if classlabels_strings else \
            [int(v) for v in classlabels_int64s]
        got = ctx.cache["zipmap"] = (keys, _row_dict_builder(keys))
    keys, row_dict = got
    if X.ndim == 0 or X.ndim > 2:
        raise ValueError(f"ZipMap: input must be 1D or 2D, got shape {X.shape}")
    X2 = X.reshape(1, -1) if X.ndim == 1 else X
    if X2.shape[1] != len(keys):
        raise ValueError(f"ZipMap: {X2.shape[1]} values per row but {len(keys)} class labels")
    return list(map(row_dict, X2.tolist()))


def _row_dict_builder(keys: list):
    """``row -> {keys[0]: row[0], ...}`` as one dict display: half the time of ``dict(zip(keys, row))``
    per row. The keys are ``int``s or ``str``s, whose ``repr`` is always their literal; a repeated
    key keeps its last value, as ``dict(zip(...))`` does. Many labels: ``dict(zip(...))``."""
    if len(keys) > 64 or not all(type(k) in (int, str) for k in keys):
        return lambda row: dict(zip(keys, row))
    body = ", ".join(f"{k!r}: r[{i}]" for i, k in enumerate(keys))
    return eval(f"lambda r: {{{body}}}", {"__builtins__": {}})  # noqa: S307 - literals only (above)


def _map_value_dtype(ctx, mapping):
    want = ctx.output_dtypes[0] if ctx.output_dtypes else None
    if want is not None:
        return np.dtype(want)
    vals = list(mapping.values())
    if not vals:
        return np.dtype(_F32)
    v = vals[0]
    if isinstance(v, str):
        return np.dtype(object)
    if isinstance(v, np.generic):
        return v.dtype
    if isinstance(v, (bool, int, np.integer)):
        return np.dtype(np.int64)
    return np.dtype(_F32)


@kernel("DictVectorizer", 1, domain=ML)
def dict_vectorizer(ctx, X, *, int64_vocabulary, string_vocabulary):
    if not isinstance(X, dict):
        raise ValueError(f"DictVectorizer expects a map, got {type(X).__name__}")
    vocab = list(string_vocabulary) if string_vocabulary else [int(v) for v in (int64_vocabulary or [])]
    dt = _map_value_dtype(ctx, X)
    zero = "" if dt == object else dt.type(0)
    out = np.empty((1, len(vocab)), dtype=dt)
    out[0, :] = [X.get(k, zero) for k in vocab]
    return out


def _castmap_value(v, to: str):
    if to == "TO_FLOAT":
        return float(v)
    if to == "TO_INT64":
        return int(float(v)) if not isinstance(v, str) else int(v.strip())
    if isinstance(v, str):
        return v
    return "%f" % float(np.float32(v))  # std::to_string(float)


def _check_castmap(node):
    a = node.attrs
    if a.get("cast_to") not in ("TO_FLOAT", "TO_STRING", "TO_INT64"):
        return f"cast_to={a.get('cast_to')!r} is not TO_FLOAT, TO_STRING or TO_INT64"
    if a.get("map_form") not in ("DENSE", "SPARSE"):
        return f"map_form={a.get('map_form')!r} is not DENSE or SPARSE"
    return None


@kernel("CastMap", 1, domain=ML, check=_check_castmap)
def cast_map(ctx, X, *, cast_to, map_form, max_map):
    if not isinstance(X, dict):
        raise ValueError(f"CastMap expects a map, got {type(X).__name__}")
    items = sorted((int(k), v) for k, v in X.items())
    dt = {"TO_FLOAT": np.dtype(_F32), "TO_INT64": np.dtype(np.int64), "TO_STRING": np.dtype(object)}[cast_to]
    if map_form == "DENSE":
        vals = [_castmap_value(v, cast_to) for _, v in items]
    else:
        if items and items[0][0] < 0:
            raise ValueError("CastMap: negative keys are not permitted with SPARSE")
        pad = "0.f" if cast_to == "TO_STRING" else 0
        m = int(max_map)
        vals = [pad] * m
        for k_, v in items:
            if k_ < m:
                vals[k_] = _castmap_value(v, cast_to)
    out = np.empty((1, len(vals)), dtype=dt)
    out[0, :] = vals
    return out
