/* The built-in Qwen3.5 ChatML template, used for checkpoints that ship none.
 *
 * Layout (the Qwen3 template's, which tests/test_template.c checks against the real Qwen3
 * template on conversations where the two agree):
 *   - system block: a leading system message, then with tools the tool list (one JSON object per
 *     line inside <tools></tools>) and the <tool_call> instructions;
 *   - user and later system messages: <|im_start|>ROLE\nCONTENT<|im_end|>\n;
 *   - assistant messages after the last real user query keep their reasoning as
 *     <think>\nR\n</think>\n\n (R from reasoning_content or split off content at </think>),
 *     earlier ones drop it; tool calls follow as <tool_call>\n{"name": .., "arguments": ..}\n
 *     </tool_call>;
 *   - consecutive tool results share one user turn of <tool_response> blocks;
 *   - the generation prompt opens the reasoning block (Qwen3.5): "<think>\n", or an empty block
 *     when enable_thinking is false.
 * Content may be a string, none, or a list of {type: "text", text} parts. */
#include "template/chat_template.h"

static const char QWEN35_TEMPLATE[] =
    "{%- macro text_of(content) -%}\n"
    "    {%- if content is string -%}{{ content }}\n"
    "    {%- elif content is sequence and content is not mapping -%}\n"
    "        {%- for part in content if part is mapping and part.type == 'text' -%}{{ part.text }}{%- endfor -%}\n"
    "    {%- endif -%}\n"
    "{%- endmacro -%}\n"
    "{%- set first_is_system = messages | length > 0 and messages[0].role == 'system' -%}\n"
    "{%- if tools -%}\n"
    "    {{- '<|im_start|>system\\n' -}}\n"
    "    {%- if first_is_system -%}{{- text_of(messages[0].content) + '\\n\\n' -}}{%- endif -%}\n"
    "    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}\n"
    "    {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}\n"
    "    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}\n"
    "{%- elif first_is_system -%}\n"
    "    {{- '<|im_start|>system\\n' + text_of(messages[0].content) + '<|im_end|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{#- the last user turn that is a real query, not a wrapped tool result -#}\n"
    "{%- set ns = namespace(last_query=messages | length - 1) -%}\n"
    "{%- for m in messages -%}\n"
    "    {%- set t = text_of(m.content) -%}\n"
    "    {%- if m.role == 'user' and not (t.startswith('<tool_response>') and t.endswith('</tool_response>')) -%}\n"
    "        {%- set ns.last_query = loop.index0 -%}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- for m in messages -%}\n"
    "    {%- set content = text_of(m.content) -%}\n"
    "    {%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}\n"
    "        {{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' -}}\n"
    "    {%- elif m.role == 'assistant' -%}\n"
    "        {%- set reasoning = '' -%}\n"
    "        {%- if m.reasoning_content is string -%}\n"
    "            {%- set reasoning = m.reasoning_content -%}\n"
    "        {%- elif '</think>' in content -%}\n"
    "            {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}\n"
    "            {%- set content = content.split('</think>')[-1].lstrip('\\n') -%}\n"
    "        {%- endif -%}\n"
    "        {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}\n"
    "            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') -}}\n"
    "        {%- else -%}\n"
    "            {{- '<|im_start|>assistant\\n' + content -}}\n"
    "        {%- endif -%}\n"
    "        {%- for call in (m.tool_calls or []) -%}\n"
    "            {%- set f = call.function if call.function is defined else call -%}\n"
    "            {%- if not loop.first or content -%}{{- '\\n' -}}{%- endif -%}\n"
    "            {{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' -}}\n"
    "            {{- f.arguments if f.arguments is string else (f.arguments | tojson) -}}\n"
    "            {{- '}\\n</tool_call>' -}}\n"
    "        {%- endfor -%}\n"
    "        {{- '<|im_end|>\\n' -}}\n"
    "    {%- elif m.role == 'tool' -%}\n"
    "        {%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}\n"
    "        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' -}}\n"
    "        {%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{- '<|im_start|>assistant\\n' -}}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false -%}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' -}}\n"
    "    {%- else -%}\n"
    "        {{- '<think>\\n' -}}\n"
    "    {%- endif -%}\n"
    "{%- endif -%}\n";

const char *ds_chat_template_qwen35_fallback(void) { return QWEN35_TEMPLATE; }
