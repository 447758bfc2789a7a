#!/usr/bin/env python3
"""spec_acceptance.py — MTP speculative-decoding acceptance of the demo model on its held-out text.

The held-out chapters of models/qwen35-demo (its README: canonical chapter index i with
i % 50 == 25 of the KJV corpus that tools/extract_corpus.sh writes) become prompts: the chapter
document's header and first --verses verses, as tools/train_demo.py formats chapters. For each k
it runs `deltaserve generate -p PROMPT -n N --ignore-eos --num-speculative-tokens k` and sums the
counters generate prints on stderr (steps, draft tokens, accepted tokens).

    python3 tools/spec_acceptance.py --bin build/deltaserve --corpus .carry/demo/kjv.txt --k 1,3
"""
import argparse
import re
import subprocess
import sys

LINE = re.compile(r"^(.+) (\d+):(\d+)\t(.+)$")
STATS = re.compile(r"acceptance rate: [0-9.]+, mean accepted length: [0-9.]+ \(k=(\d+), (\d+) steps, "
                   r"(\d+) of (\d+) draft tokens accepted; per position:([0-9. ]+)\)")


def chapters(path):
    out, key = [], {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = LINE.match(line.rstrip("\n"))
            if not m:
                continue
            k = (m.group(1), int(m.group(2)))
            if k not in key:
                key[k] = len(out)
                out.append((k[0], k[1], []))
            out[key[k]][2].append(m.group(4))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/deltaserve")
    ap.add_argument("--model", default="models/qwen35-demo")
    ap.add_argument("--corpus", default=".carry/demo/kjv.txt")
    ap.add_argument("--k", default="1,3")
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--verses", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    held = [c for i, c in enumerate(chapters(a.corpus)) if i % 50 == 25]
    print(f"{len(held)} held-out chapters: {', '.join(f'{b} {c}' for b, c, _ in held)}")
    for k in [int(x) for x in a.k.split(",")]:
        steps = acc = drafted = 0
        pos = [0.0] * k
        for book, c, verses in held:
            prompt = f"{book} {c}\n\n" + "\n".join(verses[:a.verses]) + "\n"
            cmd = [a.bin, "generate", "-m", a.model, "-p", prompt, "-n", str(a.n), "--ignore-eos",
                   "--num-speculative-tokens", str(k), "--device", a.device, "--print-ids",
                   "--temperature", str(a.temperature), "--seed", "1"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            m = STATS.search(r.stderr)
            if r.returncode or not m:
                sys.exit(f"{' '.join(cmd[:4])}...: exit {r.returncode}\n{r.stderr}")
            s, ac, dr = int(m.group(2)), int(m.group(3)), int(m.group(4))
            steps, acc, drafted = steps + s, acc + ac, drafted + dr
            for i, v in enumerate(m.group(5).split()):
                pos[i] += float(v) * s
        print(f"k={k} T={a.temperature}: {steps} verification steps, {acc} of {drafted} draft "
              f"tokens accepted: acceptance rate {acc / drafted:.3f}, mean accepted length "
              f"{1 + acc / steps:.3f}, per position " + " ".join(f"{p / steps:.3f}" for p in pos))


if __name__ == "__main__":
    main()
