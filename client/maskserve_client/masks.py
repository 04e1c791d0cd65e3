"""Sampling masks as CSR arrays: decoding both wire formats, checking.

A ``Mask`` holds the masks of n tokens: ``ids`` (int32, the rows
concatenated, each ascending), ``offsets`` (int64, n + 1 entries: row t is
``ids[offsets[t]:offsets[t + 1]]``) and ``logprobs`` (float32: one per
token in ``selected`` mode, one per id in ``support`` mode).  With numpy
they are numpy arrays, else ``array.array`` ('i', 'q', 'f').  Decoded from
``json`` or ``packed`` answers, the same mask gives the same arrays, bit
for bit.
"""

import array
import base64
import binascii
import math
import os
import sys

PACKED_FORMAT = "csr-i32-f32-le-v1"

MODES = ("selected", "support")


def _numpy():
    if os.environ.get("MASKSERVE_CLIENT_NO_NUMPY"):
        return None
    try:
        import numpy
    except ImportError:
        return None
    return numpy


np = _numpy()


class PackedFormatError(ValueError):
    """A packed object that does not follow csr-i32-f32-le-v1."""


class MaskFormatError(ValueError):
    """A JSON mask of the wrong shape or types."""


class MaskInvariantError(AssertionError):
    """A mask that breaks a sampling-mask invariant (see check_mask)."""


# ------------------------------------------------------------- arrays

def _i32(raw):
    if np is not None:
        return np.frombuffer(raw, dtype="<i4").astype(np.int32)
    a = array.array("i")
    if a.itemsize != 4:
        raise RuntimeError("array('i') is not 32-bit here: install numpy")
    a.frombytes(raw)
    if sys.byteorder == "big":
        a.byteswap()
    return a


def _f32(raw):
    if np is not None:
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    a = array.array("f")
    a.frombytes(raw)
    if sys.byteorder == "big":
        a.byteswap()
    return a


def _i32_list(v):
    if np is not None:
        return np.asarray(v, dtype=np.int64).astype(np.int32)
    return array.array("i", v)


def _f32_list(v):
    # float64 -> float32 rounds to nearest, as strtof does: the server's
    # shortest decimals read back as the very float32 it computed
    if np is not None:
        return np.asarray(v, dtype=np.float64).astype(np.float32)
    return array.array("f", v)


def _offsets(lengths):
    if np is not None:
        off = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=off[1:])
        return off
    off = array.array("q", [0])
    s = 0
    for n in lengths:
        s += n
        off.append(s)
    return off


def _concat(parts, kind):
    if np is not None:
        dt = {"i": np.int32, "f": np.float32, "q": np.int64}[kind]
        return np.concatenate(parts).astype(dt) if parts \
            else np.zeros(0, dtype=dt)
    out = array.array(kind)
    for p in parts:
        out.extend(p)
    return out


def _bytes(a):
    """Little-endian bytes of an array, for bitwise comparisons."""
    if np is not None and isinstance(a, np.ndarray):
        return a.astype(a.dtype.newbyteorder("<")).tobytes()
    b = array.array(a.typecode, a)
    if sys.byteorder == "big":
        b.byteswap()
    return b.tobytes()


# ------------------------------------------------------------- classes

class Mask:
    """The sampling masks of n tokens, CSR."""

    __slots__ = ("mode", "ids", "offsets", "logprobs")

    def __init__(self, mode, ids, offsets, logprobs):
        if mode not in MODES:
            raise ValueError("mode must be 'selected' or 'support'")
        self.mode = mode
        self.ids = ids
        self.offsets = offsets
        self.logprobs = logprobs

    @property
    def n_tokens(self):
        return len(self.offsets) - 1

    @property
    def lengths(self):
        o = self.offsets
        if np is not None and isinstance(o, np.ndarray):
            return np.diff(o)
        return [o[i + 1] - o[i] for i in range(len(o) - 1)]

    def row(self, t):
        return self.ids[self.offsets[t]:self.offsets[t + 1]]

    def row_logprobs(self, t):
        """support: the logprobs of row t; selected: its one logprob."""
        if self.mode == "selected":
            return self.logprobs[t]
        return self.logprobs[self.offsets[t]:self.offsets[t + 1]]

    def positions(self, token_ids):
        """Index into ids of each sampled token (MaskInvariantError if a
        token is not in its row)."""
        pos = []
        for t in range(self.n_tokens):
            lo, hi = int(self.offsets[t]), int(self.offsets[t + 1])
            tok = int(token_ids[t])
            # rows are ascending: bisect
            a, b = lo, hi
            while a < b:
                m = (a + b) // 2
                if self.ids[m] < tok:
                    a = m + 1
                else:
                    b = m
            if a == hi or self.ids[a] != tok:
                raise MaskInvariantError(
                    "token %d: the sampled id %d is not in its row" % (t, tok))
            pos.append(a)
        return pos

    def sampled_logprobs(self, token_ids):
        """The behaviour logprob of each sampled token (float32)."""
        if self.mode == "selected":
            return self.logprobs
        pos = self.positions(token_ids)
        if np is not None and isinstance(self.logprobs, np.ndarray):
            return self.logprobs[np.asarray(pos, dtype=np.int64)]
        return array.array("f", [self.logprobs[p] for p in pos])

    def to_json(self):
        """(sampling_mask, sampling_mask_logprobs) as the JSON form has
        them: lists of ints, floats (the float32 values)."""
        rows = [[int(x) for x in self.row(t)] for t in range(self.n_tokens)]
        if self.mode == "selected":
            lps = [float(x) for x in self.logprobs]
        else:
            lps = [[float(x) for x in self.row_logprobs(t)]
                   for t in range(self.n_tokens)]
        return rows, lps

    def same_as(self, other):
        """Bitwise equality of the arrays (and the mode)."""
        return (self.mode == other.mode
                and _bytes(self.ids) == _bytes(other.ids)
                and _bytes(self.offsets) == _bytes(other.offsets)
                and _bytes(self.logprobs) == _bytes(other.logprobs))

    @classmethod
    def concat(cls, masks, mode=None):
        """One mask from consecutive pieces (stream events)."""
        masks = list(masks)
        if not masks:
            if mode is None:
                raise ValueError("concat of no masks needs a mode")
            return cls(mode, _concat([], "i"), _offsets([]), _concat([], "f"))
        mode = masks[0].mode
        lengths = []
        for m in masks:
            if m.mode != mode:
                raise ValueError("masks of different modes")
            lengths.extend(int(x) for x in m.lengths)
        return cls(mode, _concat([m.ids for m in masks], "i"),
                   _offsets(lengths),
                   _concat([m.logprobs for m in masks], "f"))

    def __repr__(self):
        return "Mask(%s, %d tokens, %d ids)" % (self.mode, self.n_tokens,
                                                len(self.ids))


class TopLogprobs:
    """sampling_params.logprobs of n tokens: the sampled tokens' logprobs
    and, CSR, each token's top entries (best first)."""

    __slots__ = ("token_logprobs", "ids", "offsets", "logprobs")

    def __init__(self, token_logprobs, ids, offsets, logprobs):
        self.token_logprobs = token_logprobs
        self.ids = ids
        self.offsets = offsets
        self.logprobs = logprobs

    @property
    def n_tokens(self):
        return len(self.offsets) - 1

    def same_as(self, other):
        return all(_bytes(getattr(self, k)) == _bytes(getattr(other, k))
                   for k in self.__slots__)

    @classmethod
    def concat(cls, tops):
        tops = list(tops)
        lengths = []
        for t in tops:
            o = t.offsets
            lengths.extend(int(o[i + 1] - o[i]) for i in range(len(o) - 1))
        return cls(_concat([t.token_logprobs for t in tops], "f"),
                   _concat([t.ids for t in tops], "i"), _offsets(lengths),
                   _concat([t.logprobs for t in tops], "f"))

    def __repr__(self):
        return "TopLogprobs(%d tokens)" % self.n_tokens


# ------------------------------------------------------------- packed

def _b64_field(obj, key, where):
    if key not in obj:
        raise PackedFormatError("%s.%s is missing" % (where, key))
    s = obj[key]
    if not isinstance(s, str):
        raise PackedFormatError("%s.%s must be a base64 string, not %s"
                                % (where, key, type(s).__name__))
    try:
        raw = base64.b64decode(s.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as e:
        raise PackedFormatError("%s.%s is not valid base64 (%s)"
                                % (where, key, e)) from None
    if len(raw) % 4:
        raise PackedFormatError("%s.%s holds %d bytes, not a whole number "
                                "of 4-byte values" % (where, key, len(raw)))
    return raw


def _packed_head(obj, where):
    if not isinstance(obj, dict):
        raise PackedFormatError("%s must be an object" % where)
    fmt = obj.get("format")
    if fmt != PACKED_FORMAT:
        raise PackedFormatError("%s.format is %r; this client reads %r"
                                % (where, fmt, PACKED_FORMAT))


def _lengths(raw, where, n_tokens):
    lengths = _i32(raw)
    if n_tokens is not None and len(lengths) != n_tokens:
        raise PackedFormatError("%s.lengths has %d rows for %d tokens"
                                % (where, len(lengths), n_tokens))
    for t, n in enumerate(lengths):
        if n < 0:
            raise PackedFormatError("%s.lengths[%d] is negative (%d)"
                                    % (where, t, n))
    return lengths


def decode_packed(obj, mode=None, n_tokens=None,
                  where="sampling_mask_packed"):
    """A Mask from a sampling_mask_packed object.

    mode: 'selected' or 'support' when known (the request's); None infers
    it from the number of logprobs (one per token or one per id: the two
    agree when every row has one id, then 'selected' is taken).
    n_tokens: the number of tokens the object must cover (len(token_ids)).
    Raises PackedFormatError naming the key on anything malformed.
    """
    _packed_head(obj, where)
    lengths = _lengths(_b64_field(obj, "lengths", where), where, n_tokens)
    ids = _i32(_b64_field(obj, "ids", where))
    lps = _f32(_b64_field(obj, "logprobs", where))
    total = int(sum(int(x) for x in lengths))
    if len(ids) != total:
        raise PackedFormatError("%s.ids has %d ids; the lengths add up to %d"
                                % (where, len(ids), total))
    n = len(lengths)
    if mode is None:
        mode = "selected" if len(lps) == n else "support"
    if mode not in MODES:
        raise ValueError("mode must be 'selected' or 'support'")
    want = n if mode == "selected" else total
    if len(lps) != want:
        raise PackedFormatError(
            "%s.logprobs has %d values; %s mode over %d tokens and %d ids "
            "has %d" % (where, len(lps), mode, n, total, want))
    return Mask(mode, ids, _offsets(lengths), lps)


def decode_top_packed(obj, n_tokens=None, where="logprobs_packed"):
    """A TopLogprobs from a logprobs_packed object."""
    _packed_head(obj, where)
    tlp = _f32(_b64_field(obj, "token_logprobs", where))
    lengths = _lengths(_b64_field(obj, "lengths", where), where, n_tokens)
    ids = _i32(_b64_field(obj, "ids", where))
    lps = _f32(_b64_field(obj, "logprobs", where))
    total = int(sum(int(x) for x in lengths))
    if len(tlp) != len(lengths):
        raise PackedFormatError("%s.token_logprobs has %d values for %d "
                                "tokens" % (where, len(tlp), len(lengths)))
    if len(ids) != total or len(lps) != total:
        raise PackedFormatError("%s.ids and .logprobs have %d and %d values;"
                                " the lengths add up to %d"
                                % (where, len(ids), len(lps), total))
    return TopLogprobs(tlp, ids, _offsets(lengths), lps)


def encode_packed(mask):
    """The sampling_mask_packed object of a Mask (as the server writes
    it); for tests and for tools that store masks."""
    return {"format": PACKED_FORMAT,
            "lengths": base64.b64encode(
                _bytes(_i32_list([int(x) for x in mask.lengths]))).decode(),
            "ids": base64.b64encode(_bytes(mask.ids)).decode(),
            "logprobs": base64.b64encode(_bytes(mask.logprobs)).decode()}


# ------------------------------------------------------------- JSON

def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x):
    return (isinstance(x, (int, float)) and not isinstance(x, bool))


def decode_json(sampling_mask, sampling_mask_logprobs, mode):
    """A Mask from the JSON fields (lists of rows and of logprobs)."""
    if mode not in MODES:
        raise ValueError("mode must be 'selected' or 'support'")
    if not isinstance(sampling_mask, list) \
            or not isinstance(sampling_mask_logprobs, list):
        raise MaskFormatError("sampling_mask and sampling_mask_logprobs "
                              "must be arrays")
    if len(sampling_mask) != len(sampling_mask_logprobs):
        raise MaskFormatError("sampling_mask has %d rows, "
                              "sampling_mask_logprobs %d"
                              % (len(sampling_mask),
                                 len(sampling_mask_logprobs)))
    ids, lps, lengths = [], [], []
    for t, row in enumerate(sampling_mask):
        if not isinstance(row, list) or not all(_is_int(x) for x in row):
            raise MaskFormatError("sampling_mask[%d] must be an array of "
                                  "integers" % t)
        ids.extend(row)
        lengths.append(len(row))
        lp = sampling_mask_logprobs[t]
        if mode == "selected":
            if not _is_num(lp):
                raise MaskFormatError("sampling_mask_logprobs[%d] must be a "
                                      "number" % t)
            lps.append(lp)
        else:
            if not isinstance(lp, list) or len(lp) != len(row) \
                    or not all(_is_num(x) for x in lp):
                raise MaskFormatError("sampling_mask_logprobs[%d] must be an "
                                      "array of %d numbers" % (t, len(row)))
            lps.extend(lp)
    return Mask(mode, _i32_list(ids), _offsets(lengths), _f32_list(lps))


def decode_top_json(content):
    """A TopLogprobs from logprobs.content."""
    if not isinstance(content, list):
        raise MaskFormatError("logprobs.content must be an array")
    tlp, ids, lps, lengths = [], [], [], []
    for t, e in enumerate(content):
        try:
            tlp.append(float(e["logprob"]))
            top = e["top_logprobs"]
            lengths.append(len(top))
            for x in top:
                ids.append(int(x["token_id"]))
                lps.append(float(x["logprob"]))
        except (KeyError, TypeError, ValueError):
            raise MaskFormatError("logprobs.content[%d] is not a "
                                  "{token_id, logprob, top_logprobs} entry"
                                  % t) from None
    return TopLogprobs(_f32_list(tlp), _i32_list(ids), _offsets(lengths),
                       _f32_list(lps))


# ------------------------------------------------------------- checks

def check_mask(mask, token_ids, vocab=None, tol=1e-4):
    """Check the sampling-mask invariants; raise MaskInvariantError.

    Every row is non-empty, its ids unique and ascending (and below vocab
    when given), the sampled token is in its row, every logprob is <= 0
    (within float32 rounding) and, in support mode, the probabilities of
    a row sum to 1 within tol.
    """
    n = mask.n_tokens
    if len(token_ids) != n:
        raise MaskInvariantError("%d mask rows for %d tokens"
                                 % (n, len(token_ids)))
    if len(mask.logprobs) != (n if mask.mode == "selected"
                              else len(mask.ids)):
        raise MaskInvariantError("%d logprobs in %s mode for %d tokens and "
                                 "%d ids" % (len(mask.logprobs), mask.mode,
                                             n, len(mask.ids)))
    if np is not None and isinstance(mask.ids, np.ndarray):
        _check_np(mask, token_ids, vocab, tol)
        return
    for t in range(n):
        row = mask.row(t)
        if len(row) == 0:
            raise MaskInvariantError("row %d is empty" % t)
        for a, b in zip(row, row[1:]):
            if a >= b:
                raise MaskInvariantError("row %d is not strictly ascending "
                                         "(%d then %d)" % (t, a, b))
        if row[0] < 0 or (vocab is not None and row[-1] >= vocab):
            raise MaskInvariantError("row %d has an id outside [0, %s)"
                                     % (t, vocab))
    mask.positions(token_ids)
    for x in mask.logprobs:
        if not x <= 1e-6:
            raise MaskInvariantError("logprob %r is not <= 0" % x)
    if mask.mode == "support":
        for t in range(n):
            s = math.fsum(math.exp(x) for x in mask.row_logprobs(t))
            if abs(s - 1.0) > tol:
                raise MaskInvariantError("row %d: probabilities sum to %.7f"
                                         % (t, s))


def _check_np(mask, token_ids, vocab, tol):
    ids, off = mask.ids, mask.offsets
    n = mask.n_tokens
    lengths = np.diff(off)
    if n and lengths.min() < 1:
        raise MaskInvariantError("row %d is empty"
                                 % int(np.argmin(lengths)))
    if len(ids):
        step = np.diff(ids.astype(np.int64))
        # a step inside a row must be > 0; steps across rows are free
        inside = np.ones(len(step), dtype=bool)
        inside[off[1:-1] - 1] = False
        bad = np.flatnonzero(inside & (step <= 0))
        if len(bad):
            t = int(np.searchsorted(off, bad[0], side="right") - 1)
            raise MaskInvariantError("row %d is not strictly ascending" % t)
        if ids.min() < 0 or (vocab is not None and ids.max() >= vocab):
            raise MaskInvariantError("an id is outside [0, %s)" % vocab)
    mask.positions(token_ids)
    if len(mask.logprobs) and not (mask.logprobs <= 1e-6).all():
        raise MaskInvariantError("a logprob is not <= 0")
    if mask.mode == "support" and n:
        s = np.add.reduceat(np.exp(mask.logprobs.astype(np.float64)),
                            off[:-1])
        bad = np.flatnonzero(np.abs(s - 1.0) > tol)
        if len(bad):
            raise MaskInvariantError("row %d: probabilities sum to %.7f"
                                     % (int(bad[0]), s[bad[0]]))
