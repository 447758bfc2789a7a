"""Replays serve_prefix_check's recorded conversations against a server (used by
serve_prefix_check.sh's reference and diagnostic steps): every recorded turn's prompt is sent as
a greedy completion of the recorded output's length, and its token ids are compared with the
recorded ones."""
import json
import os
import urllib.request


def connect(port):
    """The server's base URL and its model id."""
    base = f"http://127.0.0.1:{port}"
    model = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=5).read())["data"][0]["id"]
    return base, model


def post(base, route, body, timeout=60):
    req = urllib.request.Request(base + route, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=timeout).read())


def first_difference(a, b):
    """The first index where the id lists differ (the shorter one's length when one is a prefix)."""
    n = min(len(a), len(b))
    return next((j for j in range(n) if a[j] != b[j]), n)


def replay(base, model, path, **extra):
    """For each recorded turn of the conversations in path: (conversation, turn, the recorded
    turn, the server's choice, the index of the first difference or None when identical)."""
    for c, turns in enumerate(json.load(open(path))):
        for t, turn in enumerate(turns):
            body = {"model": model, "prompt": turn["prompt"], "max_tokens": len(turn["out"]),
                    "temperature": 0, "return_token_ids": True, **extra}
            choice = post(base, "/v1/completions", body)["choices"][0]
            ref = choice["token_ids"]
            yield c, t, turn, choice, None if ref == turn["out"] else first_difference(ref, turn["out"])


def recorded(work, k):
    """The path of the k = k run's recorded conversations, or None when it recorded none."""
    p = os.path.join(work, f"on{k}.json")
    return p if os.path.exists(p) else None
