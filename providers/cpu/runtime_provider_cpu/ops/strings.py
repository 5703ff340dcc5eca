"""CPU kernels: strings (StringNormalizer, StringSplit, StringConcat, RegexFullMatch, TfIdfVectorizer).

Design notes
------------
* String tensors are numpy ``object`` arrays of ``str``. Element-wise work goes through
  ``np.frompyfunc`` (one C-level loop calling a bound ``str`` method) or numpy's object
  ufuncs (``np.add`` concatenates ``str`` objects with broadcasting); nothing here
  depends on the process locale.
* StringNormalizer: case mapping is Python's ``str.lower`` / ``str.upper``, i.e. the
  Unicode default (full) case mapping, the same whatever locales the system has
  installed. The ``locale`` attribute is accepted but does not change the result for
  languages without locale-tailored case rules; locales whose rules differ from the
  Unicode default (Turkish/Azeri dotted and dotless i, Lithuanian dot-above) are
  declined when a case change or a case-insensitive stopword match is asked for, since
  the default mapping would be wrong there. Known differences with onnxruntime, whose
  ``towlower``/``towupper`` apply the *simple* one-to-one mapping: full mapping
  uppercases ``'ß'`` to ``'SS'`` and lowercases a word-final ``'Σ'`` to ``'ς'``.
  Stopwords remove whole *elements* of X (the spec), compared exactly when
  ``is_case_sensitive`` is 1, else lowercased on both sides.
* RegexFullMatch: Python's ``re`` with the ``ASCII`` flag, which gives ``\\w \\d \\s \\b``
  the ASCII meaning they have in RE2. Patterns are parsed first and declined when they
  use syntax RE2 does not have (backreferences, lookaround, conditionals, atomic groups,
  possessive quantifiers) or that ``re`` cannot compile (``\\pN``, ``\\Q..\\E``, ...);
  case-insensitive patterns that also use Perl classes are declined (RE2 folds case over
  Unicode while its classes stay ASCII: ``re`` cannot do both at once).
* TfIdfVectorizer: tokens are mapped to pool ids once (``np.unique`` +
  ``searchsorted``), every n-gram of a given size and skip becomes one integer key
  (mixed radix over the pool ids), keys are looked up with ``searchsorted`` in the
  sorted pool keys and counted with ``np.bincount`` -- no Python loop over tokens.
* StringSplit is ``str.split``: without a delimiter (or with ""), runs of Unicode
  whitespace separate and leading/trailing whitespace is dropped (also from the
  remainder left by ``maxsplit``); onnxruntime treats only ' ' as whitespace there. An
  empty string gives zero substrings for any delimiter, as onnxruntime does.
"""

from __future__ import annotations

import re

import numpy as np

from ..registry import kernel

try:  # Python >= 3.11
    import re._parser as _sre_parse  # type: ignore[import-not-found]
    import re._constants as _sre_const  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_const  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]


def _to_str_array(x) -> np.ndarray:
    """An object array of ``str`` (bytes elements are decoded as UTF-8)."""
    x = np.asarray(x)
    if x.dtype != object:
        return x.astype(str).astype(object)
    flat = x.reshape(-1)
    if flat.size and any(not isinstance(v, str) for v in flat.tolist()):
        fix = np.frompyfunc(lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v), 1, 1)
        return fix(x).astype(object)
    return x


_str_lower = np.frompyfunc(str.lower, 1, 1)
_str_upper = np.frompyfunc(str.upper, 1, 1)


# ---------------------------------------------------------------------------------------
# StringNormalizer
# ---------------------------------------------------------------------------------------

_TAILORED_LOCALES = ("tr", "az", "lt")


def _check_string_normalizer(node):
    action = node.attrs.get("case_change_action") or "NONE"
    if action not in ("NONE", "LOWER", "UPPER"):
        return f"case_change_action={action!r} is not one of NONE, LOWER, UPPER"
    loc = (node.attrs.get("locale") or "").strip()
    lang = re.split(r"[_\-.@]", loc, maxsplit=1)[0].lower() if loc else ""
    insensitive = not node.attrs.get("is_case_sensitive", 0) and node.attrs.get("stopwords")
    if lang in _TAILORED_LOCALES and (action != "NONE" or insensitive):
        return (f"locale {loc!r} has locale-tailored case mapping; this kernel implements "
                "the Unicode default case mapping only")
    return None


@kernel("StringNormalizer", 10, check=_check_string_normalizer)
def string_normalizer(ctx, x, *, case_change_action, is_case_sensitive, locale, stopwords):
    if x.ndim == 2 and x.shape[0] != 1 or x.ndim not in (1, 2):
        raise ValueError(f"StringNormalizer accepts [C] or [1, C] inputs, got shape {x.shape}")
    x = _to_str_array(x)
    flat = x.reshape(-1)
    if stopwords:
        if is_case_sensitive:
            stops = ctx.cache.get("stops")
            if stops is None:
                stops = ctx.cache["stops"] = np.array(list(stopwords), dtype=object)
            keep = ~np.isin(flat, stops)
        else:
            stops = ctx.cache.get("lstops")
            if stops is None:
                stops = ctx.cache["lstops"] = np.array([w.lower() for w in stopwords], dtype=object)
            keep = ~np.isin(_str_lower(flat).astype(object), stops) if flat.size else np.zeros(0, bool)
        flat = flat[keep]
    if case_change_action == "LOWER" and flat.size:
        flat = _str_lower(flat).astype(object)
    elif case_change_action == "UPPER" and flat.size:
        flat = _str_upper(flat).astype(object)
    else:
        flat = flat.copy()
    if flat.size == 0:
        flat = np.array([""], dtype=object)
    return flat.reshape(1, -1) if x.ndim == 2 else flat


# ---------------------------------------------------------------------------------------
# StringSplit / StringConcat
# ---------------------------------------------------------------------------------------

@kernel("StringSplit", 20)
def string_split(ctx, x, *, delimiter, maxsplit):
    x = _to_str_array(x)
    sep = delimiter if delimiter else None  # unspecified or "": split on whitespace runs
    ms = -1 if maxsplit is None else int(maxsplit)
    flat = x.reshape(-1)
    if flat.size == 0:
        return np.empty((*x.shape, 0), dtype=object), np.zeros(x.shape, dtype=np.int64)
    # an empty string has no substrings whatever the delimiter (as onnxruntime does;
    # Python's "".split(",") would give [""])
    if sep is None and ms >= 0:  # the remainder after maxsplit loses its trailing whitespace too
        def split(s):
            p = s.split(None, ms)
            if p:
                p[-1] = p[-1].rstrip()
            return p
    else:
        def split(s):
            return s.split(sep, ms) if s else []
    parts = np.frompyfunc(split, 1, 1)(flat)
    counts = np.frompyfunc(len, 1, 1)(parts).astype(np.int64)
    width = int(counts.max(initial=0))
    out = np.full((flat.size, width), "", dtype=object)
    if width:
        rows = np.repeat(np.arange(flat.size), counts)
        cols = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
        values = np.empty(rows.size, dtype=object)
        values[:] = [p for ps in parts.tolist() for p in ps]
        out[rows, cols] = values
    return out.reshape(*x.shape, width), counts.reshape(x.shape)


@kernel("StringConcat", 20)
def string_concat(ctx, x, y):
    x = _to_str_array(x)
    y = _to_str_array(y)
    out = np.add(x, y, dtype=object)
    return np.asarray(out, dtype=object)


# ---------------------------------------------------------------------------------------
# RegexFullMatch
# ---------------------------------------------------------------------------------------

_NOT_RE2 = {
    "GROUPREF": "backreferences", "GROUPREF_EXISTS": "conditional groups",
    "ASSERT": "lookaround assertions", "ASSERT_NOT": "lookaround assertions",
    "ATOMIC_GROUP": "atomic groups", "POSSESSIVE_REPEAT": "possessive quantifiers",
}
_PERL_CATEGORIES = {"CATEGORY_DIGIT", "CATEGORY_NOT_DIGIT", "CATEGORY_SPACE", "CATEGORY_NOT_SPACE",
                    "CATEGORY_WORD", "CATEGORY_NOT_WORD"}


def _walk(parsed, found: set):
    for op, av in parsed:
        name = str(op)
        found.add(name)
        if name == "CATEGORY":
            found.add(str(av))
        elif name == "AT" and str(av) in ("AT_BOUNDARY", "AT_NON_BOUNDARY"):
            found.add("CATEGORY_WORD")
        elif name == "SUBPATTERN" and av[1] & re.IGNORECASE:  # a scoped (?i:...)
            found.add("IGNORECASE")
        stack = [av]
        while stack:
            v = stack.pop()
            if isinstance(v, _sre_parse.SubPattern):
                _walk(v, found)
            elif isinstance(v, (list, tuple)):
                if len(v) == 2 and not isinstance(v[0], (list, tuple, _sre_parse.SubPattern)) \
                        and str(v[0]) == "CATEGORY":
                    found.add(str(v[1]))
                    continue
                stack.extend(v)


def _compile_re2(pattern: str):
    """``(compiled, None)`` or ``(None, reason)`` for an RE2 pattern."""
    try:
        parsed = _sre_parse.parse(pattern, 0)
    except (re.error, _sre_const.error) as exc:  # noqa: B014 - same class on new Pythons
        return None, f"pattern {pattern!r} is not supported: {exc}"
    found: set = set()
    _walk(parsed, found)
    for op, what in _NOT_RE2.items():
        if op in found:
            return None, f"pattern {pattern!r} uses {what}, which RE2 syntax does not have"
    flags = parsed.state.flags
    if flags & re.VERBOSE:
        return None, f"pattern {pattern!r} uses the (?x) flag, which RE2 does not have"
    if flags & re.IGNORECASE or "IGNORECASE" in found:
        if found & _PERL_CATEGORIES:
            return None, (f"pattern {pattern!r} mixes case-insensitive matching with Perl classes "
                          "(\\w \\d \\s \\b): RE2's Unicode case folding with ASCII classes is not reproduced")
        use = 0
    else:
        use = re.ASCII
    try:
        return re.compile(pattern, use), None
    except re.error as exc:
        return None, f"pattern {pattern!r} is not supported: {exc}"


def _check_regex(node):
    pattern = node.attrs.get("pattern")
    if pattern is None:
        return "RegexFullMatch needs the pattern attribute"
    return _compile_re2(pattern)[1]


@kernel("RegexFullMatch", 20, check=_check_regex)
def regex_full_match(ctx, x, *, pattern):
    rx = ctx.cache.get("rx")
    if rx is None:
        rx, reason = _compile_re2(pattern)
        if rx is None:
            raise ValueError(reason)
        ctx.cache["rx"] = rx
    x = _to_str_array(x)
    if x.size == 0:
        return np.zeros(x.shape, dtype=bool)
    fm = rx.fullmatch
    return np.frompyfunc(lambda s: fm(s) is not None, 1, 1)(x).astype(bool)


# ---------------------------------------------------------------------------------------
# TfIdfVectorizer
# ---------------------------------------------------------------------------------------

def _check_tfidf(node):
    a = node.attrs
    if a.get("mode") not in ("TF", "IDF", "TFIDF"):
        return f"mode={a.get('mode')!r} is not one of TF, IDF, TFIDF"
    if bool(a.get("pool_int64s")) == bool(a.get("pool_strings")):
        return "exactly one of pool_int64s and pool_strings must be set"
    if not a.get("ngram_indexes") or a.get("ngram_counts") is None:
        return "ngram_counts and ngram_indexes are required"
    if a.get("min_gram_length") is None or a.get("max_gram_length") is None or a.get("max_skip_count") is None:
        return "min_gram_length, max_gram_length and max_skip_count are required"
    if a["min_gram_length"] < 1 or a["max_gram_length"] < a["min_gram_length"] or a["max_skip_count"] < 0:
        return "invalid min_gram_length / max_gram_length / max_skip_count"
    return None


def _tfidf_tables(pool, ngram_counts, ngram_indexes, min_n, max_n):
    """Vocabulary, and per n-gram size the sorted keys of pool n-grams and their output index."""
    pool = list(pool)
    vocab = np.unique(np.array(pool, dtype=object if isinstance(pool[0], str) else np.int64))
    ids = np.searchsorted(vocab, np.array(pool, dtype=vocab.dtype)).astype(np.int64)
    V = int(vocab.size) + 1  # id V-1+1 never used: 0..V-2 are pool ids, -1 -> not found
    tables = {}
    gid = 0  # running n-gram number over the whole pool (indexes ngram_indexes)
    counts = list(ngram_counts) + [len(pool)]
    for size, (start, end) in enumerate(zip(counts[:-1], counts[1:]), start=1):
        k = (end - start) // size
        if k <= 0:
            continue
        if min_n <= size <= max_n:
            grams = ids[start:start + k * size].reshape(k, size)
            keys = _keys(grams, V)
            outs = np.asarray(ngram_indexes[gid:gid + k], dtype=np.int64)
            # a repeated n-gram keeps the last id (as the reference's trie does)
            uk, first_rev = np.unique(keys[::-1], return_index=True)
            tables[size] = (uk, outs[::-1][first_rev])
        gid += k
    return vocab, V, tables


def _keys(grams: np.ndarray, V: int):
    """Mixed-radix keys of rows of pool ids (object ints when int64 could overflow)."""
    size = grams.shape[-1]
    if V ** size < 2 ** 62:
        w = V ** np.arange(size - 1, -1, -1, dtype=np.int64)
        return grams @ w
    g = grams.astype(object)
    key = np.zeros(grams.shape[:-1], dtype=object)
    for j in range(size):
        key = key * V + g[..., j]
    return key


@kernel("TfIdfVectorizer", 9, check=_check_tfidf)
def tfidf_vectorizer(ctx, x, *, max_gram_length, max_skip_count, min_gram_length, mode,
                     ngram_counts, ngram_indexes, pool_int64s, pool_strings, weights):
    tab = ctx.cache.get("tables")
    if tab is None:
        pool = pool_strings if pool_strings else pool_int64s
        tab = ctx.cache["tables"] = _tfidf_tables(pool, ngram_counts, ngram_indexes,
                                                  min_gram_length, max_gram_length)
    vocab, V, tables = tab
    out_size = int(max(ngram_indexes)) + 1
    if x.ndim == 0:
        rows = x.reshape(1, 1)
    elif x.ndim == 1:
        rows = x.reshape(1, -1)
    elif x.ndim == 2:
        rows = x
    else:
        raise ValueError(f"TfIdfVectorizer accepts [C] or [B, C] inputs, got shape {x.shape}")
    B, C = rows.shape
    freq = np.zeros(B * out_size, dtype=np.int64)
    if rows.size and tables:
        if vocab.dtype == object:
            tok = _to_str_array(rows)
        else:
            tok = rows.astype(np.int64)
        pos = np.searchsorted(vocab, tok).clip(0, vocab.size - 1)
        ids = np.where(vocab[pos] == tok, pos, -1).astype(np.int64)
        row_base = (np.arange(B, dtype=np.int64) * out_size)[:, None]
        for size, (keys, outs) in tables.items():
            skips = [1] if size == 1 else range(1, max_skip_count + 2)
            for d in skips:
                span = (size - 1) * d
                if span >= C:
                    break
                starts = np.arange(C - span)
                idx = starts[:, None] + d * np.arange(size)[None, :]
                grams = ids[:, idx]  # [B, n_starts, size]
                valid = (grams >= 0).all(axis=-1)
                key = _keys(np.where(grams >= 0, grams, 0), V)
                p = np.searchsorted(keys, key).clip(0, keys.size - 1)
                hit = valid & (keys[p] == key)
                if hit.any():
                    flat = (row_base + outs[p])[hit]
                    freq += np.bincount(flat.astype(np.int64), minlength=freq.size)
    freq = freq.reshape(B, out_size)
    w = np.asarray(weights, dtype=np.float32) if weights else None
    if mode == "TF":
        y = freq.astype(np.float32)
    elif mode == "IDF":
        y = (freq > 0).astype(np.float32)
        if w is not None:
            y = y * w[:out_size]
    else:  # TFIDF
        y = freq.astype(np.float32)
        if w is not None:
            y = y * w[:out_size]
    y = y.astype(np.float32)
    return y.reshape(out_size) if x.ndim < 2 else y
