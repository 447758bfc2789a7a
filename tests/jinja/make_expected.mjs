// Renders every (template × conversation × options) case of conversations.json with the reference
// renderer @huggingface/jinja and writes expected.json, which tests/test_template_compare.c
// compares with deltaserve's renderer byte for byte.
//
//   node make_expected.mjs           rewrite expected.json
//   node make_expected.mjs --check   exit 1 when expected.json differs from a fresh rendering
//
// The render context is the one transformers' apply_chat_template builds: messages, tools (null
// when absent), add_generation_prompt, the tokenizer's bos_token / eos_token strings, then the
// chat_template_kwargs; continue_final_message cuts the text after the final message's content
// the way transformers does.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";

const here = path.dirname(fileURLToPath(import.meta.url));
const set = JSON.parse(fs.readFileSync(path.join(here, "conversations.json"), "utf8"));

function tokenText(v) {
	if (typeof v === "string") return v;
	if (v && typeof v === "object" && typeof v.content === "string") return v.content;
	return undefined;
}

// The template a checkpoint directory gives for a request (chat_template.jinja wins).
function loadPackage(pkg, haveTools) {
	const dir = path.join(here, "node_modules", pkg, "models");
	const cfg = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
	let text = null;
	const ct = cfg.chat_template;
	if (typeof ct === "string") text = ct;
	else if (Array.isArray(ct)) {
		const byName = Object.fromEntries(ct.map((e) => [e.name, e.template]));
		text = (haveTools && byName.tool_use) || byName.default || ct[0]?.template || null;
	}
	const jinja = path.join(dir, "chat_template.jinja");
	if (fs.existsSync(jinja)) text = fs.readFileSync(jinja, "utf8");
	return { text, bos: tokenText(cfg.bos_token), eos: tokenText(cfg.eos_token) };
}

// Python's str.isspace / strip, as transformers' continue_final_message uses them.
const PY_SPACE = /^[\t\n\v\f\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]$/;
function pyStripBounds(s) {
	const cps = Array.from(s);
	let a = 0, b = cps.length;
	while (a < b && PY_SPACE.test(cps[a])) a++;
	while (b > a && PY_SPACE.test(cps[b - 1])) b--;
	return [cps.slice(0, a).join("").length, cps.slice(0, b).join("").length]; // UTF-16 offsets
}

function continueFinal(rendered, messages) {
	const last = messages[messages.length - 1];
	let msg = last?.content;
	if (Array.isArray(msg)) msg = msg.filter((b) => typeof b?.text === "string").map((b) => b.text).pop();
	if (typeof msg !== "string") throw new Error("continue_final_message needs a final message with text content");
	const [a, b] = pyStripBounds(msg);
	const stripped = msg.slice(a, b);
	const loc = rendered.lastIndexOf(stripped);
	if (loc < 0) throw new Error("continue_final_message: the final message does not appear in the rendered chat");
	const lstrippedLen = msg.length - a;
	if (rendered.slice(loc, loc + lstrippedLen) === msg) return rendered.slice(0, loc + lstrippedLen);
	return rendered.slice(0, loc + stripped.length);
}

const compiled = new Map();
function compile(key, text) {
	if (!compiled.has(key)) {
		try {
			compiled.set(key, { tpl: new Template(text) });
		} catch (e) {
			compiled.set(key, { error: String(e.message || e) });
		}
	}
	return compiled.get(key);
}

const templates = [...set.templates];
for (const f of fs.readdirSync(path.join(here, "templates")).sort())
	if (f.endsWith(".jinja")) templates.push({ name: f.replace(/\.jinja$/, ""), file: `templates/${f}` });

const cases = [];
const skipped = [];
for (const t of templates) {
	for (const conv of set.conversations) {
		const tools = typeof conv.tools === "string" ? set.tools[conv.tools] : (conv.tools ?? null);
		let text, bos, eos;
		if (t.package) {
			({ text, bos, eos } = loadPackage(t.package, Array.isArray(tools) && tools.length > 0));
			if (text === null) {
				if (!skipped.includes(t.name)) skipped.push(t.name);
				continue;
			}
		} else {
			text = fs.readFileSync(path.join(here, t.file), "utf8"); // no bos / eos tokens
			bos = eos = undefined;
		}
		const c = compile(`${t.name}:${text.length}:${text}`, text);
		for (const opt of set.options) {
			const last = conv.messages[conv.messages.length - 1];
			if (opt.continue_final_message && last?.role !== "assistant") continue;
			const ctx = { messages: conv.messages, tools, add_generation_prompt: !!opt.add_generation_prompt };
			if (bos !== undefined) ctx.bos_token = bos;
			if (eos !== undefined) ctx.eos_token = eos;
			Object.assign(ctx, opt.kwargs || {});
			const rec = { template: t.name, conversation: conv.name, option: opt.name };
			if (c.error) rec.error = c.error;
			else {
				try {
					let out = c.tpl.render(structuredClone(ctx));
					if (opt.continue_final_message) out = continueFinal(out, conv.messages);
					// As UTF-8 bytes (what a server sends / a file holds), a lone surrogate is U+FFFD.
					rec.output = out.toWellFormed();
				} catch (e) {
					rec.error = String(e.message || e);
				}
			}
			cases.push(rec);
		}
	}
}

const doc = {
	generator: "tests/jinja/make_expected.mjs",
	reference: "@huggingface/jinja " + JSON.parse(fs.readFileSync(path.join(here, "node_modules/@huggingface/jinja/package.json"), "utf8")).version,
	templates: templates.map((t) => ({ name: t.name, package: t.package, file: t.file, skipped: skipped.includes(t.name) ? "the package ships no chat_template" : undefined })),
	cases,
};
const json = JSON.stringify(doc, null, 1) + "\n";
const target = path.join(here, "expected.json");
if (process.argv.includes("--check")) {
	const old = fs.existsSync(target) ? fs.readFileSync(target, "utf8") : "";
	if (old !== json) {
		console.error("tests/jinja/expected.json is stale: run `node tests/jinja/make_expected.mjs`");
		process.exit(1);
	}
	console.log(`expected.json up to date (${cases.length} cases)`);
} else {
	fs.writeFileSync(target, json);
	const errors = cases.filter((c) => c.error).length;
	console.log(`wrote ${cases.length} cases (${errors} expected errors); skipped: ${skipped.join(", ") || "none"}`);
}
