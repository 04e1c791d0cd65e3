"""The client's decoding without a server: both wire formats into the
same CSR arrays, stream events merged, malformed packed data refused
with an error naming the key, and the invariant checks.

Runs with numpy and, with MASKSERVE_CLIENT_NO_NUMPY=1, without it.
MSV_TEST_SEED changes the random seed.
"""

import base64
import json
import math
import os
import random
import struct
import unittest

import maskserve_client as mc
from maskserve_client import masks as mm

SEED = int(os.environ.get("MSV_TEST_SEED", "20261201"), 0)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def random_mask(rng, mode, n=None, vocab=5000):
    n = rng.randint(0, 12) if n is None else n
    rows, lps, tokens = [], [], []
    for _ in range(n):
        k = rng.choice([1, 1, 2, 7, 40, rng.randint(1, 300)])
        row = sorted(rng.sample(range(vocab), k))
        rows.append(row)
        tokens.append(rng.choice(row))
        specials = [0.0, -0.0, -1e-45, -3.4028235e38, -1.1920929e-7]
        vals = [f32(rng.choice(specials) if rng.random() < 0.1
                    else -rng.expovariate(0.5)) for _ in row]
        lps.append(vals[rng.randrange(k)] if mode == "selected" else vals)
    return rows, lps, tokens


def json_roundtrip(obj):
    # as the server's text reaches the client
    return json.loads(json.dumps(obj))


class Decode(unittest.TestCase):

    def test_numpy_backend(self):
        want = not os.environ.get("MASKSERVE_CLIENT_NO_NUMPY")
        self.assertEqual(mm.np is not None, want,
                         "numpy use follows MASKSERVE_CLIENT_NO_NUMPY")

    def test_known_bytes(self):
        # the example of docs/API.md
        m = mc.decode_packed({"format": "csr-i32-f32-le-v1",
                              "lengths": "AwAAAAIAAAA=",
                              "ids": "ZQAAALsAAAAAAgAAKgAAAFgAAAA=",
                              "logprobs": "KVxPv4/C9b0="}, "selected")
        self.assertEqual([int(x) for x in m.ids], [101, 187, 512, 42, 88])
        self.assertEqual([int(x) for x in m.offsets], [0, 3, 5])
        self.assertEqual([float(x) for x in m.logprobs],
                         [f32(-0.81), f32(-0.12)])

    def test_roundtrip_both_forms(self):
        rng = random.Random(SEED)
        for i in range(300):
            mode = rng.choice(mm.MODES)
            rows, lps, _ = random_mask(rng, mode)
            a = mc.decode_json(json_roundtrip(rows), json_roundtrip(lps),
                               mode)
            b = mc.decode_packed(json_roundtrip(mc.encode_packed(a)), mode,
                                 n_tokens=len(rows))
            self.assertTrue(a.same_as(b), "round %d" % i)
            r2, l2 = b.to_json()
            self.assertEqual(r2, rows)
            self.assertTrue(mc.decode_json(r2, l2, mode).same_as(a))
            # negative zero and denormals keep their bits
            self.assertEqual(mm._bytes(a.logprobs), mm._bytes(b.logprobs))

    def test_random_events_merge(self):
        rng = random.Random(SEED + 1)
        for i in range(100):
            mode = rng.choice(mm.MODES)
            packed = rng.random() < 0.5
            rows, lps, tokens = random_mask(rng, mode, n=rng.randint(0, 30))
            whole = mc.decode_json(rows, lps, mode)
            tops = [[(tok, -0.5)] + [(rng.randrange(5000), f32(-rng.random()
                                                              * 9))
                                     for _ in range(rng.randint(0, 4))]
                    for tok in tokens]
            # cut the tokens into events at random points
            cuts = sorted(rng.sample(range(len(rows) + 1),
                                     rng.randint(0, len(rows) + 1)))
            bounds = [0] + cuts + [len(rows)]
            events = []
            for a, b in zip(bounds, bounds[1:]):
                c = {"index": 0, "token_ids": tokens[a:b],
                     "finish_reason": None}
                sub = mc.decode_json(rows[a:b], lps[a:b], mode)
                content = [{"token_id": tokens[t], "logprob": tops[t][0][1],
                            "top_logprobs": [{"token_id": x, "logprob": y}
                                             for x, y in tops[t]]}
                           for t in range(a, b)]
                if packed:
                    c["sampling_mask_packed"] = mc.encode_packed(sub)
                    top = mc.decode_top_json(content)
                    c["logprobs_packed"] = {
                        "format": mc.PACKED_FORMAT,
                        "token_logprobs": b64(mm._bytes(top.token_logprobs)),
                        "lengths": b64(struct.pack(
                            "<%di" % (b - a), *[len(tops[t])
                                                for t in range(a, b)])),
                        "ids": b64(mm._bytes(top.ids)),
                        "logprobs": b64(mm._bytes(top.logprobs))}
                else:
                    c["sampling_mask"] = rows[a:b]
                    c["sampling_mask_logprobs"] = lps[a:b]
                    c["logprobs"] = {"content": content}
                events.append(mc.decode_event(json_roundtrip(
                    {"request_id": "r", "seed": 1, "choices": [c]}), mode))
            res = mc.merge_events(events, mode)
            self.assertEqual(res.events, len(events))
            ch = res.choices[0] if res.choices else None
            if ch is None:
                self.assertEqual(len(events), 0)
                continue
            self.assertTrue(ch.mask.same_as(whole), "round %d" % i)
            self.assertEqual([int(x) for x in ch.token_ids], tokens)
            want_top = mc.decode_top_json(
                [{"token_id": tokens[t], "logprob": tops[t][0][1],
                  "top_logprobs": [{"token_id": x, "logprob": y}
                                   for x, y in tops[t]]}
                 for t in range(len(tokens))])
            self.assertTrue(ch.top.same_as(want_top), "round %d" % i)
            if mode == "selected":
                # the random logprobs are <= 0 but not normalized rows
                mc.check_mask(ch.mask, ch.token_ids, vocab=5000)

    def test_malformed_packed(self):
        good = {"format": "csr-i32-f32-le-v1", "lengths": b64(i32(2, 1)),
                "ids": b64(i32(3, 9, 4)), "logprobs": b64(f32s(-1.0, 0.0))}
        mc.decode_packed(good, "selected", n_tokens=2)
        cases = [
            ({"format": "csr-i64-f32-le-v1"}, "format"),
            ({"format": None}, "format"),
            ({"lengths": None}, "lengths must be a base64 string"),
            ({"ids": 12}, "ids must be a base64 string"),
            ({"ids": "AwAAAAkAAAAEAAA"}, "ids is not valid base64"),
            ({"ids": "AwAAAAkAAAAEAAA*"}, "ids is not valid base64"),
            ({"ids": "AwAAAAkAAAAEAAAA\n"}, "ids is not valid base64"),
            ({"ids": "AwAAAAkAAAAEAA=="}, "not a whole number of 4-byte"),
            ({"ids": b64(i32(3, 9))}, "lengths add up to 3"),
            ({"lengths": b64(i32(2, 1, 0))}, "lengths has 3 rows for 2"),
            ({"lengths": b64(i32(4, -1))}, "lengths[1] is negative"),
            ({"logprobs": b64(f32s(-1.0))}, "logprobs has 1 values"),
            ({"logprobs": "é"}, "logprobs is not valid base64"),
        ]
        for change, msg in cases:
            obj = dict(good, **change)
            with self.assertRaises(mc.PackedFormatError) as e:
                mc.decode_packed(obj, "selected", n_tokens=2)
            self.assertIn(msg, str(e.exception))
            self.assertIn("sampling_mask_packed", str(e.exception))
        for key in ("lengths", "ids", "logprobs"):
            obj = dict(good)
            del obj[key]
            with self.assertRaisesRegex(mc.PackedFormatError,
                                        "sampling_mask_packed.%s is missing"
                                        % key):
                mc.decode_packed(obj, "selected")
        with self.assertRaisesRegex(mc.PackedFormatError, "must be an object"):
            mc.decode_packed([1, 2], "selected")
        with self.assertRaisesRegex(mc.PackedFormatError,
                                    "logprobs_packed.token_logprobs"):
            mc.decode_top_packed(dict(good, token_logprobs="AAAA"),
                                 n_tokens=2)

    def test_corrupted_packed_fuzz(self):
        # random damage to valid objects: a PackedFormatError or a
        # consistent mask, never another exception
        rng = random.Random(SEED + 2)
        alphabet = ("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                    "0123456789+/=-_ \n!")
        errors = 0
        for i in range(1500):
            mode = rng.choice(mm.MODES)
            rows, lps, _ = random_mask(rng, mode, n=rng.randint(1, 6))
            obj = mc.encode_packed(mc.decode_json(rows, lps, mode))
            key = rng.choice(["lengths", "ids", "logprobs"])
            s = list(obj[key])
            for _ in range(rng.randint(1, 3)):
                op = rng.randrange(3)
                at = rng.randrange(len(s) + 1)
                if op == 0 and s:
                    del s[min(at, len(s) - 1)]
                elif op == 1:
                    s.insert(at, rng.choice(alphabet))
                elif s:
                    s[min(at, len(s) - 1)] = rng.choice(alphabet)
            obj[key] = "".join(s)
            try:
                m = mc.decode_packed(obj, mode, n_tokens=len(rows))
            except mc.PackedFormatError:
                errors += 1
                continue
            self.assertEqual(m.n_tokens, len(rows))
            self.assertEqual(len(m.ids), int(m.offsets[-1]))
        self.assertGreater(errors, 1000)

    def test_check_mask(self):
        s = sum(math.exp(x) for x in (-2.0, -0.5, -1.5))
        norm = [[x - math.log(s) for x in (-2.0, -0.5, -1.5)], [0.0]]
        ok = mc.decode_json([[1, 5, 9], [2]], norm, "support")
        mc.check_mask(ok, [5, 2], vocab=10)
        bad = [
            (mc.decode_json([[1, 5, 9], [2]], norm, "support"), [4, 2],
             "not in its row"),
            (mc.decode_json([[1, 9, 5], [2]], norm, "support"), [5, 2],
             "ascending"),
            (mc.decode_json([[1, 5, 5], [2]], norm, "support"), [5, 2],
             "ascending"),
            (mc.decode_json([[1, 5, 9], [2]], [[-2.0, -0.5, -1.5], [0.0]],
                            "support"), [5, 2], "sum to"),
            (mc.decode_json([[1, 5, 9], [12]], norm, "support"), [5, 12],
             "outside"),
            (mc.decode_json([[1, 5, 9], []], [norm[0], []], "support"),
             [5, 2], "empty"),
            (mc.decode_json([[3], [2]], [0.5, 0.0], "selected"), [3, 2],
             "<= 0"),
        ]
        for m, tok, msg in bad:
            with self.assertRaises(mc.MaskInvariantError) as e:
                mc.check_mask(m, tok, vocab=10)
            self.assertIn(msg, str(e.exception))

    def test_json_shape_errors(self):
        with self.assertRaisesRegex(mc.MaskFormatError, "sampling_mask\\[1\\]"):
            mc.decode_json([[1], ["2"]], [0.0, 0.0], "selected")
        with self.assertRaisesRegex(mc.MaskFormatError,
                                    "sampling_mask_logprobs\\[0\\]"):
            mc.decode_json([[1, 2]], [[0.0]], "support")

    def test_choices_merge_by_index(self):
        # sampling_params.n: events carry the choices with news, each its
        # index and seed, and a choice's finish_reason once
        evs = [{"request_id": "g", "seed": 5, "choices": [
                    {"index": 0, "seed": 5, "token_ids": [1],
                     "finish_reason": None},
                    {"index": 1, "seed": 6, "token_ids": [2],
                     "finish_reason": None}]},
               {"request_id": "g", "seed": 5, "choices": [
                    {"index": 1, "seed": 6, "token_ids": [3, 4],
                     "finish_reason": "stop"}]},
               {"request_id": "g", "seed": 5, "choices": [
                    {"index": 0, "seed": 5, "token_ids": [7],
                     "finish_reason": "length"}],
                "usage": {"prompt_tokens": 2, "completion_tokens": 5}}]
        res = mc.merge_events([mc.decode_event(e) for e in evs])
        self.assertEqual([c.index for c in res.choices], [0, 1])
        self.assertEqual([list(c.token_ids) for c in res.choices],
                         [[1, 7], [2, 3, 4]])
        self.assertEqual([c.seed for c in res.choices], [5, 6])
        self.assertEqual([c.finish_reason for c in res.choices],
                         ["length", "stop"])
        self.assertEqual(res.usage["completion_tokens"], 5)

    def test_error_event(self):
        with self.assertRaises(mc.ServerError) as e:
            mc.decode_event({"error": {"message": "slow", "type": "overloaded",
                                       "param": None, "code": 503}})
        self.assertEqual((e.exception.status, e.exception.type), (503,
                                                                  "overloaded"))


def b64(raw):
    return base64.b64encode(raw).decode()


def i32(*v):
    return struct.pack("<%di" % len(v), *v)


def f32s(*v):
    return struct.pack("<%df" % len(v), *v)


if __name__ == "__main__":
    unittest.main()
