// End-to-end tests of `deltaserve serve` through the official OpenAI Node client: a real server
// process on 127.0.0.1 with an ephemeral port, chat and completions, streaming and not.
// Run from this folder: `npm ci && node --test` (DS_BIN / DS_SERVER_TEST_MODEL override the
// binary and the model; by default build/deltaserve and the demo model when present, else the
// tiny test model). Every wait is bounded and every server is killed at the end.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const BIN = process.env.DS_BIN || path.join(ROOT, 'build/deltaserve');
const DEMO = path.join(ROOT, 'models/qwen35-demo');
const MODEL = process.env.DS_SERVER_TEST_MODEL ||
  (existsSync(path.join(DEMO, 'tokenizer.json')) ? DEMO : path.join(ROOT, 'tests/data/models/tiny-moe-tok'));

const servers = new Set();

/** Starts `deltaserve serve` on an ephemeral port; resolves once it listens (30 s at most). */
function startServer(extra = [], model = MODEL) {
  const args = ['serve', '-m', model, '--port', '0', '--device', 'cpu', '--threads', '2',
    '--served-model-name', 'tiny', ...extra];
  const proc = spawn(BIN, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  servers.add(proc);
  let log = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => { proc.kill('SIGKILL'); reject(new Error(`server did not start:\n${log}`)); }, 30000);
    proc.stderr.on('data', (b) => {
      log += b;
      const m = /listening on http:\/\/\S+:(\d+)\n/.exec(log);
      if (m) {
        clearTimeout(timer);
        const port = Number(m[1]);
        resolve({ proc, port, baseURL: `http://127.0.0.1:${port}/v1`, log: () => log });
      }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited (${code}):\n${log}`)); });
  });
}

/** SIGTERM, then a bounded wait for a clean exit (SIGKILL after 10 s). Resolves the exit code. */
function stopServer(s) {
  return new Promise((resolve) => {
    if (s.proc.exitCode !== null) return resolve(s.proc.exitCode);
    const timer = setTimeout(() => s.proc.kill('SIGKILL'), 10000);
    s.proc.removeAllListeners('exit');
    s.proc.on('exit', (code, sig) => { clearTimeout(timer); servers.delete(s.proc); resolve(sig ? sig : code); });
    s.proc.kill('SIGTERM');
  });
}

after(() => { for (const p of servers) p.kill('SIGKILL'); });

function generate(ids, n, extra = []) {
  const out = execFileSync(BIN, ['generate', '-m', MODEL, '--device', 'cpu', '--tokens', ids.join(','),
    '-n', String(n), '--print-ids', ...extra], { stdio: ['ignore', 'pipe', 'ignore'] });
  return out.toString().trim().split(',').map(Number);
}

async function metrics(s) {
  const text = await (await fetch(`http://127.0.0.1:${s.port}/metrics`)).text();
  const get = (name) => Number((new RegExp(`^deltaserve:${name}\\{[^}]*\\} (\\S+)$`, 'm').exec(text) || [])[1]);
  return { get, text };
}

async function waitIdle(s) {
  for (let i = 0; i < 100; i++) {
    const m = await metrics(s);
    if (m.get('num_requests_running') === 0 && m.get('kv_cache_blocks_used') === 0 &&
        m.get('state_slots_used') === 0) return true;
    await new Promise((r) => setTimeout(r, 100));
  }
  return false;
}

const PROMPT = [7, 99, 256, 31, 400, 12, 5, 77];

test('serve through the OpenAI client', async (t) => {
  const s = await startServer(['--max-model-len', '512', '--max-num-seqs', '8']);
  const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });

  await t.test('models.list', async () => {
    const page = await client.models.list();
    assert.equal(page.data[0].id, 'tiny');
    assert.equal(page.data[0].max_model_len, 512);
  });

  await t.test('models.retrieve', async () => {
    const m = await client.models.retrieve('tiny');
    assert.equal(m.id, 'tiny');
    assert.equal(m.object, 'model');
    await assert.rejects(client.models.retrieve('gpt-9'),
      (e) => e.status === 404 && e.code === 'model_not_found');
  });

  await t.test('greedy completion = deltaserve generate', async () => {
    const r = await client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 20,
      temperature: 0, return_token_ids: true });
    assert.deepEqual(r.choices[0].token_ids, generate(PROMPT, 20));
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.deepEqual([r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens], [8, 20, 28]);
  });

  await t.test('completion: stream = non-stream for the same seed', async () => {
    const req = { model: 'tiny', prompt: 'Once upon a time', max_tokens: 32, temperature: 0.8,
      top_p: 0.9, seed: 7, return_token_ids: true };
    const whole = await client.completions.create(req);
    const stream = await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    let text = '', ids = [], usage = null, finish = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.text; ids.push(...(c.token_ids || []));
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(text, whole.choices[0].text);
    assert.deepEqual(ids, whole.choices[0].token_ids);
    assert.deepEqual(usage, whole.usage);
    assert.equal(finish, whole.choices[0].finish_reason);
  });

  await t.test('structured outputs: response_format json_schema', async () => {
    const schema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { enum: [1, 2, 3] } },
      required: ['ok', 'n'], additionalProperties: false };
    for (const temperature of [0, 1]) {
      const r = await client.chat.completions.create({ model: 'tiny', max_completion_tokens: 120,
        messages: [{ role: 'user', content: 'Is it so?' }], temperature, seed: 11,
        chat_template_kwargs: { enable_thinking: false },
        response_format: { type: 'json_schema', json_schema: { name: 'answer', strict: true, schema } } });
      assert.equal(r.choices[0].finish_reason, 'stop');
      const o = JSON.parse(r.choices[0].message.content);
      assert.deepEqual(Object.keys(o), ['ok', 'n']);
      assert.equal(typeof o.ok, 'boolean');
      assert.ok([1, 2, 3].includes(o.n));
    }
    await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'json_schema', json_schema: { name: 'a', schema: { type: 'object',
        properties: { s: { type: 'string', format: 'email' } } } } } }),
      (e) => e.status === 400 && e.param === 'response_format' && /format/.test(e.message));
  });

  await t.test('chat n = 3: stream = non-stream per choice; usage summed', async () => {
    const req = { model: 'tiny', messages: [{ role: 'user', content: 'Name a colour.' }],
      max_completion_tokens: 12, temperature: 0.9, seed: 3, n: 3,
      chat_template_kwargs: { enable_thinking: false } };
    const whole = await client.chat.completions.create(req);
    assert.deepEqual(whole.choices.map((c) => c.index), [0, 1, 2]);
    const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    const content = ['', '', ''];
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) content[c.index] += c.delta.content || '';
    }
    assert.deepEqual(content, whole.choices.map((c) => c.message.content));
    assert.deepEqual(usage, whole.usage);
  });

  await t.test('logit_bias +100 forces a token', async () => {
    const r = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time',
      max_tokens: 3, temperature: 0, logit_bias: { 42: 100 }, return_token_ids: true });
    assert.deepEqual(r.choices[0].token_ids, [42, 42, 42]);
  });

  for (const thinking of [true, false]) {
    await t.test(`chat (thinking ${thinking}): stream = non-stream for the same seed`, async () => {
      const req = { model: 'tiny', messages: [{ role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Tell me about the sea.' }], max_completion_tokens: 40,
        temperature: 0.7, seed: 11, chat_template_kwargs: { enable_thinking: thinking },
        return_token_ids: true };
      const whole = await client.chat.completions.create(req);
      const msg = whole.choices[0].message;
      assert.equal(msg.role, 'assistant');
      const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
      let content = '', reasoning = '', ids = [], usage = null, roles = [];
      for await (const chunk of stream) {
        if (chunk.usage) usage = chunk.usage;
        for (const c of chunk.choices) {
          if (c.delta.role) roles.push(c.delta.role);
          content += c.delta.content || '';
          reasoning += c.delta.reasoning_content || '';
          ids.push(...(c.token_ids || []));
        }
      }
      assert.deepEqual(roles, ['assistant']);
      assert.equal(content, msg.content);
      assert.equal(reasoning, msg.reasoning_content || '');
      if (!thinking) assert.equal(msg.reasoning_content, null);
      assert.deepEqual(ids, whole.choices[0].token_ids);
      assert.deepEqual(usage, whole.usage);
    });
  }

  await t.test('greedy chat = deltaserve generate on the chat prompt', async () => {
    const r = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 16, temperature: 0, return_token_ids: true });
    assert.deepEqual(r.choices[0].token_ids, generate(r.prompt_token_ids, 16));
  });

  await t.test('logprobs', async () => {
    const r = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3 });
    const lp = r.choices[0].logprobs.content;
    assert.equal(lp.length, 4);
    for (const e of lp) {
      assert.equal(e.top_logprobs.length, 3);
      assert.equal(e.logprob, Math.max(...e.top_logprobs.map((x) => x.logprob))); // greedy = top
    }
  });

  await t.test('bad input is an OpenAI error the client understands', async () => {
    const cases = [
      [{ prompt: 'x', temperature: -1 }, 'temperature', null],
      [{ prompt: 'x', top_p: 1.5 }, 'top_p', null],
      [{ prompt: 'x', top_p: 0 }, 'top_p', null],
      [{ prompt: 'x', max_tokens: -5 }, 'max_tokens', null],
      [{ prompt: 'x', max_tokens: 'ten' }, 'max_tokens', null],
      [{ prompt: 'x', n: 17 }, 'n', null],
      [{ prompt: 'x', logit_bias: { 99999: 1 } }, 'logit_bias', null],
      [{ prompt: [1, 2, 99999] }, 'prompt', null],
      [{ prompt: PROMPT, max_tokens: 510 }, 'prompt', 'context_length_exceeded'],
    ];
    for (const [body, param, code] of cases) {
      await assert.rejects(client.completions.create({ model: 'tiny', ...body }), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${JSON.stringify(body)}: ${e}`);
        assert.equal(e.status, 400);
        assert.equal(e.param, param);
        assert.equal(e.code, code);
        assert.equal(e.type, 'invalid_request_error');
        return true;
      });
    }
    await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }],
      max_tokens: 600 }), (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded' &&
      /512 tokens/.test(e.message) && /600 in the completion/.test(e.message));
    await assert.rejects(client.chat.completions.create({ model: 'gpt-x', messages: [{ role: 'user', content: 'x' }] }),
      (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
  });

  await t.test('an aborted stream frees its KV blocks and state slot', async () => {
    const before = (await metrics(s)).get('generation_tokens_total');
    const ac = new AbortController();
    const stream = await client.completions.create({ model: 'tiny', prompt: [5, 6, 7], max_tokens: 480,
      temperature: 0, ignore_eos: true, stream: true }, { signal: ac.signal });
    let n = 0;
    try { // the client either ends the iteration or throws an abort error: both are fine
      for await (const _ of stream) { if (++n === 2) ac.abort(); }
    } catch (e) { assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', String(e)); }
    assert.equal(n, 2);
    assert.ok(await waitIdle(s), 'caches still held after the client went away');
    const m = await metrics(s);
    assert.ok(m.get('generation_tokens_total') - before < 480, 'the request ran to completion');
  });

  assert.equal(await stopServer(s), 0);
});

test('API key', async () => {
  const s = await startServer(['--api-key', 'k3y', '--max-model-len', '128']);
  const wrong = new OpenAI({ baseURL: s.baseURL, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(wrong.completions.create({ model: 'tiny', prompt: 'x', max_tokens: 2 }),
    (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  const right = new OpenAI({ baseURL: s.baseURL, apiKey: 'k3y', maxRetries: 0 });
  const r = await right.completions.create({ model: 'tiny', prompt: 'x', max_tokens: 2 });
  assert.equal(r.usage.completion_tokens, 2);
  assert.equal(await stopServer(s), 0);
});

test('queue full: 503 + Retry-After, and retrying clients all get through', async () => {
  const s = await startServer(['--max-model-len', '256', '--max-num-seqs', '1', '--max-queue', '1']);
  const req = { model: 'tiny', prompt: PROMPT, max_tokens: 60, temperature: 0, ignore_eos: true, return_token_ids: true };
  const solo = (await new OpenAI({ baseURL: s.baseURL, apiKey: 'x', maxRetries: 0 }).completions.create(req)).choices[0].token_ids;
  const noRetry = new OpenAI({ baseURL: s.baseURL, apiKey: 'x', maxRetries: 0 });
  const results = await Promise.allSettled(Array.from({ length: 8 }, () => noRetry.completions.create(req)));
  const refused = results.filter((r) => r.status === 'rejected');
  assert.ok(refused.length >= 1, 'nothing was refused');
  for (const r of refused) {
    assert.ok(r.reason instanceof OpenAI.APIError && r.reason.status === 503, String(r.reason));
    assert.equal(r.reason.code, 'queue_full');
    assert.equal(r.reason.headers.get('retry-after'), '1');
  }
  for (const r of results.filter((x) => x.status === 'fulfilled')) assert.deepEqual(r.value.choices[0].token_ids, solo);
  // the client honours Retry-After: with retries every request eventually succeeds
  const retrying = new OpenAI({ baseURL: s.baseURL, apiKey: 'x', maxRetries: 30, timeout: 120000 });
  const all = await Promise.all(Array.from({ length: 4 }, () => retrying.completions.create({ ...req, max_tokens: 20 })));
  for (const r of all) assert.deepEqual(r.choices[0].token_ids, solo.slice(0, 20));
  assert.ok(await waitIdle(s));
  assert.equal(await stopServer(s), 0);
});

// Tool calls. No model here emits calls reliably, so the route is made deterministic: tiny-moe-tok
// with a chat template that teaches the XML call form (tests/data/server/xml_tools.jinja) and a
// named tool_choice. The server then ends the prompt with "<tool_call>\n<function=get_weather>\n"
// and, with max_tokens 1, no generated token can complete a parameter: whatever the untrained
// model emits, the response is that one call with no arguments, cut off by max_tokens.
test('tool calls through the OpenAI client', async (t) => {
  const tiny = path.join(ROOT, 'tests/data/models/tiny-moe-tok');
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ds-e2e-xml-'));
  for (const f of ['config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json'])
    copyFileSync(path.join(tiny, f), path.join(dir, f));
  copyFileSync(path.join(ROOT, 'tests/data/server/xml_tools.jinja'), path.join(dir, 'chat_template.jinja'));
  const s = await startServer(['--max-model-len', '512'], dir);
  const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const base = { model: 'tiny', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 1, temperature: 0 };
  try {
    await t.test('non-streaming: message.tool_calls', async () => {
      const r = await client.chat.completions.create(base);
      const c = r.choices[0];
      assert.equal(c.message.content, null);
      assert.equal(c.finish_reason, 'length');
      assert.equal(c.message.tool_calls.length, 1);
      const call = c.message.tool_calls[0];
      assert.equal(call.type, 'function');
      assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
      assert.equal(call.function.name, 'get_weather');
      assert.deepEqual(JSON.parse(call.function.arguments), {});
    });
    await t.test('streaming: the client assembles the same call from the deltas', async () => {
      const stream = client.chat.completions.stream({ ...base, stream: true });
      const done = await stream.finalChatCompletion();
      const c = done.choices[0];
      assert.equal(c.finish_reason, 'length');
      assert.equal(c.message.tool_calls.length, 1);
      assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
      assert.deepEqual(JSON.parse(c.message.tool_calls[0].function.arguments), {});
      assert.match(c.message.tool_calls[0].id, /^call_/);
    });
    await t.test('a tool call in the history renders; the answer is a normal message', async () => {
      const r = await client.chat.completions.create({
        model: 'tiny', tools, max_tokens: 2, temperature: 0,
        messages: [{ role: 'user', content: 'Weather in Paris?' },
          { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
            function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
          { role: 'tool', tool_call_id: 'call_1', content: 'sunny' }] });
      assert.ok(Array.isArray(r.choices[0].message.tool_calls));
    });
    await t.test('an unknown named function is a 400 on tool_choice', async () => {
      await assert.rejects(client.chat.completions.create({ ...base,
        tool_choice: { type: 'function', function: { name: 'nope' } } }),
      (e) => e.status === 400 && e.param === 'tool_choice');
    });
  } finally {
    assert.equal(await stopServer(s), 0);
    rmSync(dir, { recursive: true, force: true });
  }
});
