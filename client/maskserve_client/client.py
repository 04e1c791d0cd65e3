"""HTTP client for /inference/v1/generate and /inference/v1/abort.

Standard library only (http.client).  A Result (or each streamed Event)
holds its choices with the masks and top logprobs decoded into CSR
arrays, whichever mask_format was asked.
"""

import http.client
import json
import urllib.parse

from .masks import (Mask, TopLogprobs, MaskFormatError, decode_json,
                    decode_packed, decode_top_json, decode_top_packed,
                    _i32_list, _concat)


class ServerError(Exception):
    """An error answer: HTTP status (or the error event's code), type,
    message, param."""

    def __init__(self, status, type_, message, param=None):
        super().__init__("%s %s: %s%s" % (status, type_, message,
                                          " (%s)" % param if param else ""))
        self.status = status
        self.type = type_
        self.message = message
        self.param = param


class Choice:
    """One choice: token_ids (int32), mask (Mask or None), top
    (TopLogprobs or None), finish_reason (None until the end), seed (its
    own seed when the request has several choices, else None)."""

    __slots__ = ("index", "token_ids", "mask", "top", "finish_reason",
                 "seed")

    def __init__(self, index, token_ids, mask, top, finish_reason,
                 seed=None):
        self.index = index
        self.token_ids = token_ids
        self.mask = mask
        self.top = top
        self.finish_reason = finish_reason
        self.seed = seed

    def __repr__(self):
        return "Choice(%d, %d tokens, %r, %r, %s)" % (
            self.index, len(self.token_ids), self.mask, self.top,
            self.finish_reason)


class Event:
    """A decoded stream event (or a whole body): request_id, seed,
    choices, usage (the last event only)."""

    __slots__ = ("request_id", "seed", "choices", "usage", "raw_bytes")

    def __init__(self, request_id, seed, choices, usage, raw_bytes):
        self.request_id = request_id
        self.seed = seed
        self.choices = choices
        self.usage = usage
        self.raw_bytes = raw_bytes


class Result(Event):
    """The whole answer; streamed answers also count their events."""

    __slots__ = ("events",)


def decode_choice(c, mode=None):
    """A Choice from one element of "choices" (a body's or an event's).

    mode: the request's sampling_logprobs_mode; it is needed to read a
    JSON mask and checked against a packed one.
    """
    tok = c.get("token_ids")
    if not isinstance(tok, list):
        raise MaskFormatError("choices[].token_ids must be an array")
    token_ids = _i32_list(tok)
    mask = top = None
    if "sampling_mask_packed" in c:
        mask = decode_packed(c["sampling_mask_packed"], mode,
                             n_tokens=len(tok))
    elif "sampling_mask" in c:
        mask = decode_json(c["sampling_mask"],
                           c.get("sampling_mask_logprobs"),
                           mode or "selected")
        if mask.n_tokens != len(tok):
            raise MaskFormatError("%d mask rows for %d tokens"
                                  % (mask.n_tokens, len(tok)))
    if "logprobs_packed" in c:
        top = decode_top_packed(c["logprobs_packed"], n_tokens=len(tok))
    elif isinstance(c.get("logprobs"), dict):
        top = decode_top_json(c["logprobs"].get("content"))
    return Choice(c.get("index", 0), token_ids, mask, top,
                  c.get("finish_reason"), c.get("seed"))


def decode_event(obj, mode=None, raw_bytes=0):
    """An Event from a parsed body or event; ServerError for an error."""
    if "error" in obj:
        e = obj["error"] or {}
        raise ServerError(e.get("code"), e.get("type"), e.get("message"),
                          e.get("param"))
    choices = [decode_choice(c, mode) for c in obj.get("choices", [])]
    return Event(obj.get("request_id"), obj.get("seed"), choices,
                 obj.get("usage"), raw_bytes)


def merge_events(events, mode=None):
    """The Result that the concatenation of stream events makes."""
    res = Result(None, None, [], None, 0)
    res.events = 0
    parts = {}
    for ev in events:
        res.events += 1
        res.request_id = res.request_id or ev.request_id
        if ev.seed is not None:
            res.seed = ev.seed
        if ev.usage is not None:
            res.usage = ev.usage
        res.raw_bytes += ev.raw_bytes
        for c in ev.choices:
            p = parts.setdefault(c.index, [[], [], [], None, c.seed])
            p[0].append(c.token_ids)
            if c.mask is not None:
                p[1].append(c.mask)
            if c.top is not None:
                p[2].append(c.top)
            if c.finish_reason is not None:
                p[3] = c.finish_reason
    for i in sorted(parts):
        tok, masks, tops, fin, seed = parts[i]
        res.choices.append(Choice(
            i, _concat(tok, "i"),
            Mask.concat(masks, mode) if masks or mode else None,
            TopLogprobs.concat(tops) if tops else None, fin, seed))
    return res


class Client:
    """maskserve's generation API at base_url (http://host:port)."""

    def __init__(self, base_url, timeout=300.0):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError("base_url must be http://host[:port]")
        self.host = u.hostname
        self.port = u.port or 80
        self.prefix = u.path.rstrip("/")
        self.timeout = timeout

    def _post(self, path, body):
        conn = http.client.HTTPConnection(self.host, self.port,
                                          timeout=self.timeout)
        data = json.dumps(body).encode()
        conn.request("POST", self.prefix + path, body=data,
                     headers={"Content-Type": "application/json"})
        return conn, conn.getresponse()

    @staticmethod
    def _error(resp, raw):
        try:
            e = json.loads(raw)["error"]
        except (ValueError, KeyError, TypeError):
            raise ServerError(resp.status, "http_error",
                              raw[:200].decode("utf-8", "replace")) from None
        raise ServerError(e.get("code", resp.status), e.get("type"),
                          e.get("message"), e.get("param"))

    @staticmethod
    def body(token_ids, sampling_params=None, mask=None, mode="selected",
             mask_format="json", stream=False, request_id=None, **extra):
        """The request body generate() sends."""
        b = {"token_ids": list(token_ids),
             "sampling_params": dict(sampling_params or {}),
             "stream": bool(stream), "mask_format": mask_format}
        if mask:
            b["return_sampling_mask"] = True
            b["sampling_logprobs_mode"] = mode
        if request_id is not None:
            b["request_id"] = request_id
        b.update(extra)
        return b

    def generate(self, token_ids, sampling_params=None, mask=False,
                 mode="selected", mask_format="packed", stream=False,
                 request_id=None, **extra):
        """Generate; returns a Result (streamed answers are merged).

        mask: return the sampling mask of every token; mode:
        sampling_logprobs_mode; mask_format: "packed" (default) or
        "json", decoded alike.  Raises ServerError on an error answer or
        an error event.
        """
        body = self.body(token_ids, sampling_params, mask, mode, mask_format,
                         stream, request_id, **extra)
        if stream:
            return merge_events(self._events(body, mode), mode if mask
                                else None)
        conn, resp = self._post("/inference/v1/generate", body)
        try:
            raw = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            self._error(resp, raw)
        ev = decode_event(json.loads(raw), mode, len(raw))
        res = Result(ev.request_id, ev.seed, ev.choices, ev.usage,
                     ev.raw_bytes)
        res.events = 0
        return res

    def stream(self, token_ids, sampling_params=None, mask=False,
               mode="selected", mask_format="packed", request_id=None,
               **extra):
        """Generate with "stream": true; yields an Event per event."""
        body = self.body(token_ids, sampling_params, mask, mode, mask_format,
                         True, request_id, **extra)
        return self._events(body, mode)

    def _events(self, body, mode):
        conn, resp = self._post("/inference/v1/generate", body)
        try:
            if resp.status != 200:
                self._error(resp, resp.read())
            data, n = [], 0
            while True:
                line = resp.readline()
                if not line:
                    raise ServerError(resp.status, "stream_error",
                                      "the stream ended without "
                                      "data: [DONE]")
                n += len(line)
                line = line.rstrip(b"\r\n")
                if line:
                    if line.startswith(b"data: "):
                        data.append(line[6:])
                    continue
                if not data:
                    continue
                payload = b"\n".join(data)
                data = []
                if payload == b"[DONE]":
                    return
                yield decode_event(json.loads(payload), mode, n)
                n = 0
        finally:
            conn.close()

    def abort(self, request_id):
        """Cancel a request in flight; ServerError (404) if none."""
        conn, resp = self._post("/inference/v1/abort",
                                {"request_id": request_id})
        try:
            raw = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            self._error(resp, raw)
        return json.loads(raw)
