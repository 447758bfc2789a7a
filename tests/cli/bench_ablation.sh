#!/usr/bin/env bash
# deltaserve bench --ablation on the CPU backend (which ignores DS_OPT_*: this tests the plumbing,
# not the speed-ups): with the MTP fixture every row runs and the three report files are written;
# the Markdown table has one line per row, in order, with finite positive TPOT/TTFT values that
# match the JSON lines; every JSON line parses, consecutive rows differ by exactly one switch, the
# MTP row's c>1 TPOT equals (verify + draft) / tokens per step and is flagged computed; the SVG is
# well-formed with one bar per (row, batch). Without an MTP head the MTP row is "not run (no MTP
# head)" and the command still succeeds. Bad --ablation-rows are refused. Plain `deltaserve
# bench` still writes its documented JSON fields, its switches field naming the DS_OPT_* and
# DS_CUDA_* variables set.
set -u
BIN=${DS_BIN:-build/deltaserve}
DATA=${DS_TEST_DATA:-tests/data}
pass=0; fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }

SMALL=(--device cpu --threads 1 --steps 4 --warmup 1 --prompt-len 16 --batch 1,2)

# ---- every row, model with an MTP head -------------------------------------------------------
out=$tmp/mtp
if "$BIN" bench --ablation -m "$DATA/models/tiny-moe-mtp" "${SMALL[@]}" --ablation-out "$out/sub" \
     >"$tmp/mtp.out" 2>"$tmp/mtp.err"; then ok; else bad "ablation rc=$?: $(tail -5 "$tmp/mtp.err")"; fi
for f in ablation.jsonl ablation.md ablation.svg; do
  if [ -s "$out/sub/$f" ]; then ok; else bad "missing $f"; fi
done
if grep -q "^### ablation row 12: + MTP speculative decoding, k = 1" "$tmp/mtp.out"; then ok; else bad "no MTP row in stdout"; fi

# Markdown: table rows 0..12 in order, 2 TPOT columns + TTFT, all finite and positive
if node -e '
const fs = require("fs");
const md = fs.readFileSync(process.argv[1], "utf8");
const rows = md.split("\n").filter(l => /^\| \d+ \|/.test(l));
const fail = m => { console.error(m); process.exit(1); };
if (rows.length !== 13) fail("table rows: " + rows.length);
const js = fs.readFileSync(process.argv[2], "utf8").trim().split("\n").map(l => JSON.parse(l));
rows.forEach((l, i) => {
  const c = l.split(" | ").map(s => s.replace(/^\| ?| ?\|$/g, "").trim());
  if (+c[0] !== i) fail("row order: " + l);
  for (let j = 2; j <= 4; j++) {
    const m = /^(\d+\.\d+) ms( †)?$/.exec(c[j]);
    if (!m) fail("cell " + j + " not a time: " + l);
    const v = +m[1];
    if (!isFinite(v) || v <= 0) fail("not positive: " + l);
    if (j < 4) { /* TPOT cells agree with the JSON lines (3 decimals) */
      const rec = js.find(o => o.row === i && o.batch === [1, 2][j - 2]);
      if (!rec || Math.abs(rec.step_ms - v) > 0.0006) fail("md/json mismatch: " + l);
      if ((m[2] !== undefined) !== rec.computed) fail("computed mark: " + l);
    }
  }
  if (i === 0 && c[5] !== "reference") fail("row 0 change: " + l);
  if (i > 0 && !/^[+-]\d+\.\d{3} ms \([+-]\d+\.\d%\) \/ [+-]\d+\.\d{3} ms \([+-]\d+\.\d%\)$/.test(c[5]))
    fail("change column: " + l);
});
if (!/^Best c=1 row: \d+ \(.+\) at \d+\.\d{3} ms/m.test(md)) fail("no best-row line");
if (!/acceptance rate \d\.\d\d/.test(md)) fail("no acceptance note");
if (!/^- commit: `[^`]+`$/m.test(md) || !/^- command: `deltaserve bench --ablation /m.test(md)) fail("header");
' "$out/sub/ablation.md" "$out/sub/ablation.jsonl"; then ok; else bad "ablation.md"; fi

# JSON lines: 13 rows × 2 batch sizes, values, one switch changed per row, MTP row arithmetic
if node -e '
const fs = require("fs");
const fail = m => { console.error(m); process.exit(1); };
const lines = fs.readFileSync(process.argv[1], "utf8").trim().split("\n");
if (lines.length !== 26) fail("lines: " + lines.length);
const recs = lines.map(l => JSON.parse(l));
const pos = x => typeof x === "number" && isFinite(x) && x > 0;
for (const o of recs) {
  if (!o.run || !pos(o.step_ms) || !pos(o.ttft_ms) || ![1, 2].includes(o.batch)) fail("values: " + JSON.stringify(o));
  if (o.commit === undefined || o.gpu === undefined || o.model === undefined || o.label === undefined) fail("fields");
  if (o.step_ms_p10 !== null && !(pos(o.step_ms_p10) && o.step_ms_p10 <= o.step_ms && o.step_ms <= o.step_ms_p90)) fail("percentiles: " + JSON.stringify(o));
}
const sw = r => new Set(recs.find(o => o.row === r).switches.split(","));
for (let r = 1; r < 13; r++) {
  const a = sw(r - 1), b = sw(r);
  const added = [...b].filter(x => !a.has(x)), removed = [...a].filter(x => !b.has(x));
  const keys = new Set([...added, ...removed].map(x => x.split("=")[0]));
  if (keys.size !== 1) fail("row " + r + " changes " + [...keys]);
}
if (sw(0).has("graphs=1") || [...sw(0)].some(x => x.startsWith("DS_OPT_") && !x.endsWith("=0"))) fail("baseline not all off");
if ([...sw(10)].some(x => x.endsWith("=0"))) fail("row 10 not all on");
if (!sw(11).has("DS_OPT_PREFETCH=0") || [...sw(11)].filter(x => x.endsWith("=0")).length !== 1) fail("row 11 not the defaults");
const m1 = recs.find(o => o.row === 12 && o.batch === 1), m2 = recs.find(o => o.row === 12 && o.batch === 2);
if (m1.computed !== false || m2.computed !== true) fail("computed flags");
if (m1.num_speculative_tokens !== 1 || !pos(m2.verify_ms) || !pos(m2.draft_ms) || !(m2.mean_accepted_length >= 1)) fail("spec fields");
if (!(m1.acceptance_rate >= 0 && m1.acceptance_rate <= 1) || !(m1.generated >= 4)) fail("acceptance/generated");
const want = (m2.verify_ms + m2.draft_ms) / m2.mean_accepted_length;
if (Math.abs(m2.step_ms - want) > 1e-3 * want + 2e-4) fail("computed TPOT " + m2.step_ms + " vs " + want);
if (recs.filter(o => o.row < 12).some(o => o.computed || o.num_speculative_tokens !== undefined)) fail("spec fields on plain rows");
' "$out/sub/ablation.jsonl"; then ok; else bad "ablation.jsonl"; fi

# SVG: well-formed (tag stack), one bar per row and batch, legend and axis labels
if node -e '
const fs = require("fs");
const fail = m => { console.error(m); process.exit(1); };
let s = fs.readFileSync(process.argv[1], "utf8");
if (!s.startsWith("<?xml")) fail("no XML declaration");
s = s.replace(/^<\?xml[^>]*\?>/, "");
const stack = []; let roots = 0;
const re = /<(\/?)([A-Za-z][\w:-]*)((?:\s+[\w:-]+="[^"<]*")*)\s*(\/?)>|([<>])/g;
let m, last = 0;
while ((m = re.exec(s))) {
  const text = s.slice(last, m.index); last = re.lastIndex;
  if (/&(?!amp;|lt;|gt;|quot;|apos;|#)/.test(text)) fail("bad entity: " + text);
  if (m[5]) fail("stray " + m[5] + " at " + m.index);
  if (m[1]) { if (stack.pop() !== m[2]) fail("mismatched </" + m[2] + ">"); }
  else if (!m[4]) { if (!stack.length) roots++; stack.push(m[2]); }
}
if (stack.length || roots !== 1) fail("unbalanced: " + stack + " roots " + roots);
const bars = (s.match(/<rect class="bar"/g) || []).length;
if (bars !== 26) fail("bars: " + bars);
if (!/>c=1<\/text>/.test(s) || !/>c=2<\/text>/.test(s) || !/TPOT \(ms/.test(s)) fail("legend/axis");
' "$out/sub/ablation.svg"; then ok; else bad "ablation.svg"; fi

# ---- no MTP head: the MTP row is reported, not failed -----------------------------------------
if "$BIN" bench --ablation --ablation-rows 12,0 -m "$DATA/models/tiny-moe" "${SMALL[@]}" \
     --ablation-out "$tmp/nomtp" >"$tmp/nomtp.out" 2>"$tmp/nomtp.err"; then ok; else bad "no-MTP rc=$?: $(tail -3 "$tmp/nomtp.err")"; fi
if grep -Eq '^\| 12 \| \+ MTP speculative decoding, k = 1 \(16\) \| not run \(no MTP head\) \|' "$tmp/nomtp/ablation.md" &&
   [ "$(grep -Ec '^\| [0-9]+ \|' "$tmp/nomtp/ablation.md")" -eq 2 ] &&
   grep -q '"row":12,.*"run":false,"note":"not run (no MTP head)"' "$tmp/nomtp/ablation.jsonl"; then
  ok
else
  bad "no-MTP report: $(cat "$tmp/nomtp/ablation.md" 2>/dev/null | grep '^|')"
fi

# ---- bad arguments ------------------------------------------------------------------------------
"$BIN" bench --ablation --ablation-rows 13 -m "$DATA/models/tiny-moe" --device cpu >/dev/null 2>"$tmp/err"; rc=$?
if [ $rc -eq 2 ] && grep -q -- "--ablation-rows" "$tmp/err"; then ok; else bad "rows 13: rc=$rc $(cat "$tmp/err")"; fi
"$BIN" bench --ablation-rows 1 -m "$DATA/models/tiny-moe" --device cpu >/dev/null 2>"$tmp/err"; rc=$?
if [ $rc -eq 2 ] && grep -q -- "need --ablation" "$tmp/err"; then ok; else bad "rows without --ablation: rc=$rc $(cat "$tmp/err")"; fi
"$BIN" bench --ablation -m "$DATA/models/tiny-moe" --device cpu --ablation-out /dev/null/x >/dev/null 2>"$tmp/err"; rc=$?
if [ $rc -eq 1 ] && grep -q -- "--ablation-out" "$tmp/err"; then ok; else bad "bad out dir: rc=$rc $(cat "$tmp/err")"; fi

# ---- plain bench: unchanged JSON fields (bench/README.md, tools/gpu parse them) ----------------
if "$BIN" bench -m "$DATA/models/tiny-moe" "${SMALL[@]}" --json-out "$tmp/plain.jsonl" >"$tmp/plain.out" 2>&1 &&
   node -e '
const fs = require("fs");
const want = "commit gpu backend model dummy_weights batch prompt_len steps step_ms step_ms_p10 step_ms_p90 ttft_ms kernels_per_step bytes_per_step achieved_gbps copy_gbps ratio graph fused_argmax switches date";
const lines = fs.readFileSync(process.argv[1], "utf8").trim().split("\n").map(l => JSON.parse(l));
if (lines.length !== 2 || lines.some(o => Object.keys(o).join(" ") !== want)) process.exit(1);
' "$tmp/plain.jsonl" && grep -Eq '^prefill 16 tokens: [0-9.]+ ms \(median of 3\)$' "$tmp/plain.out" &&
   [ "$(grep -Ec '^ +[12] +[0-9.]+ +[0-9.]+ +[0-9.]+ ' "$tmp/plain.out")" -eq 2 ]; then
  ok
else
  bad "plain bench output: $(cat "$tmp/plain.out")"
fi
# the switches field names the DS_OPT_* and DS_CUDA_* variables set, and nothing else (runs in a
# clean environment, so that switches exported around the test do not count)
clean=(env -i PATH="$PATH" HOME="${HOME:-/tmp}")
for v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS LD_LIBRARY_PATH; do
  [ -n "${!v:-}" ] && clean+=("$v=${!v}")
done
sw_line() { node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n")[0]).switches)' "$1"; }
if "${clean[@]}" "$BIN" bench -m "$DATA/models/tiny-moe" "${SMALL[@]}" --json-out "$tmp/def.jsonl" >"$tmp/def.out" 2>&1 &&
   [ "$(sw_line "$tmp/def.jsonl")" = defaults ]; then ok; else bad "plain bench switches without variables: $(head -1 "$tmp/def.jsonl")"; fi
if "${clean[@]}" DS_OPT_PDL=0 DS_CUDA_ATTN_LANES8=0 DS_OTHER=1 "$BIN" bench -m "$DATA/models/tiny-moe" "${SMALL[@]}" \
     --json-out "$tmp/sw.jsonl" >"$tmp/sw.out" 2>&1 &&
   [ "$(sw_line "$tmp/sw.jsonl" | tr ',' '\n' | sort | tr '\n' ' ')" = "DS_CUDA_ATTN_LANES8=0 DS_OPT_PDL=0 " ] &&
   grep -q "^bench: switches: .*DS_CUDA_ATTN_LANES8=0" "$tmp/sw.out"; then
  ok
else
  bad "plain bench switches: $(head -1 "$tmp/sw.jsonl"; grep switches "$tmp/sw.out")"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
