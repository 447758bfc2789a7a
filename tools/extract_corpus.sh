#!/bin/sh
# extract_corpus.sh — writes the King James Bible as plain text, one verse per line, for
# tools/train_demo.py (the corpus of models/qwen35-demo).
#
# Source: the Debian packages bible-kjv-text (the text, /usr/lib/bible.data, in the Bible Retrieval
# System's compressed format) and bible-kjv (the `bible` program that decodes it):
#     apt-get install bible-kjv bible-kjv-text
# The KJV text is public domain (translated 1611; see /usr/share/doc/bible-kjv-text/copyright;
# the data file is "provided for unrestricted use", legend kept in models/qwen35-demo/README.md).
#
# Output format: "<Book> <chapter>:<verse>\t<verse text>\n", 31102 lines in canonical order,
# e.g. "1 Samuel 3:10\tAnd the LORD came, and stood, ...". The train / held-out split is made
# by train_demo.py (by chapter), not here.
#
# Usage: tools/extract_corpus.sh [OUT]   (default .carry/demo/kjv.txt, an ignored staging dir
#        that the device tool carries to the GPU machine)
set -eu
out=${1:-.carry/demo/kjv.txt}
command -v bible >/dev/null 2>&1 || {
    echo "extract_corpus.sh: the 'bible' program is missing (apt-get install bible-kjv)" >&2
    exit 1
}
mkdir -p "$(dirname "$out")"
tmp="$out.tmp"
# -l100000: no line wrapping, so every verse is one line "  N text" under a "Book C" heading.
bible -l100000 Gen1:1-Rev22:21 | awk '
    /^$/ { next }
    /^  [0-9]+ / {
        if (chap == "") { print "verse before any chapter heading: " $0 > "/dev/stderr"; exit 2 }
        v = $1; sub(/^  [0-9]+ /, "")
        printf "%s:%s\t%s\n", chap, v, $0; n++; next
    }
    /^[1-3A-Z][A-Za-z ]* [0-9]+$/ { chap = $0; next }
    { print "unexpected line: " $0 > "/dev/stderr"; exit 2 }
    END { if (n != 31102) { print "expected 31102 verses, got " n > "/dev/stderr"; exit 2 } }
' > "$tmp"
mv "$tmp" "$out"
echo "extract_corpus.sh: wrote $out ($(wc -l < "$out") verses, $(wc -c < "$out") bytes)"
