"""test_jinja.py — the C Jinja2 subset (src/text/jinja.c) against Python's jinja2 set up the
way transformers' apply_chat_template sets it up: ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loopcontrols, its own tojson (json.dumps, ensure_ascii=False),
raise_exception and the {% generation %} tag.

Outputs must agree byte for byte on (a) hand-written templates in the style of the Kimi K2,
DeepSeek-V3 / R1 and Qwen (ChatML with tools) chat templates over varied conversations, and
(b) a few hundred small templates drawn from a seeded grammar over random contexts, where
either both render the same text or both fail.  One case checks the data mask.
"""

import ctypes
import json
import os
import random
from ctypes import POINTER, c_char, c_char_p, c_int, c_size_t, c_uint8, c_void_p

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from conftest import quick

# ---------------------------------------------------------------------------- reference (jinja2)


class GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: renders its body (transformers also records
    where it falls, which these tests do not need)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class TemplateRaised(Exception):
    pass


def _raise_exception(message):
    raise TemplateRaised(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def reference_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


ENV = reference_env()


def reference(template, data, trusted):
    """(True, text) or (False, error text)."""
    try:
        ctx = dict(data)
        ctx.update(trusted)
        return True, ENV.from_string(template).render(**ctx)
    except Exception as e:  # every jinja2 failure counts as "fails"
        return False, f"{type(e).__name__}: {e}"


# ---------------------------------------------------------------------------- the C side


class DdtError(ctypes.Structure):
    _fields_ = [("status", c_int), ("msg", c_char * 512)]


class JinjaText(ctypes.Structure):
    _fields_ = [("bytes", POINTER(c_char)), ("data", POINTER(c_uint8)), ("len", c_size_t)]


class CJinja:
    def __init__(self, libpath):
        L = ctypes.CDLL(libpath)
        L.ddt_jinja_parse.argtypes = [c_char_p, c_size_t, POINTER(c_void_p), POINTER(DdtError)]
        L.ddt_jinja_parse.restype = c_int
        L.ddt_jinja_free.argtypes = [c_void_p]
        L.ddt_jinja_free.restype = None
        L.ddt_jinja_render.argtypes = [c_void_p, c_void_p, c_void_p, POINTER(JinjaText), POINTER(DdtError)]
        L.ddt_jinja_render.restype = c_int
        L.ddt_jinja_text_free.argtypes = [POINTER(JinjaText)]
        L.ddt_jinja_text_free.restype = None
        self.L = L
        J = ctypes.CDLL("libjansson.so.4")
        J.json_loads.argtypes = [c_char_p, c_size_t, c_void_p]
        J.json_loads.restype = c_void_p
        J.json_delete.argtypes = [c_void_p]
        J.json_delete.restype = None
        self.J = J

    def _json(self, obj):
        p = self.J.json_loads(json.dumps(obj).encode(), 0, None)
        assert p, "jansson could not read the context"
        return p

    def _free_json(self, p):
        # json_decref is a macro: refcount is the second field of json_t (after the type enum)
        class JsonT(ctypes.Structure):
            _fields_ = [("type", c_int), ("refcount", c_size_t)]
        j = ctypes.cast(p, POINTER(JsonT)).contents
        j.refcount -= 1
        if j.refcount == 0:
            self.J.json_delete(p)

    def render(self, template, data, trusted):
        """(status, text bytes, mask bytes, message)."""
        src = template.encode("utf-8")
        t = c_void_p()
        err = DdtError()
        st = self.L.ddt_jinja_parse(src, len(src), ctypes.byref(t), ctypes.byref(err))
        if st != 0:
            return st, b"", b"", err.msg.decode("utf-8", "replace")
        jd, jt = self._json(data), self._json(trusted)
        out = JinjaText()
        try:
            st = self.L.ddt_jinja_render(t, jd, jt, ctypes.byref(out), ctypes.byref(err))
            if st != 0:
                assert out.len == 0
                return st, b"", b"", err.msg.decode("utf-8", "replace")
            text = ctypes.string_at(out.bytes, out.len)
            mask = ctypes.string_at(out.data, out.len) if out.len else b""
            return 0, text, mask, ""
        finally:
            self.L.ddt_jinja_text_free(ctypes.byref(out))
            self._free_json(jd)
            self._free_json(jt)
            self.L.ddt_jinja_free(t)


@pytest.fixture(scope="module")
def cj(libddtree_path):
    return CJinja(libddtree_path)


def compare(cj, template, data, trusted=None):
    trusted = trusted or {}
    ok, want = reference(template, data, trusted)
    st, got, _, msg = cj.render(template, data, trusted)
    if ok:
        assert st == 0, f"C failed where jinja2 rendered {want!r}: {msg}\ntemplate: {template!r}"
        assert got.decode("utf-8") == want, f"template: {template!r}\ndata: {data!r}"
    else:
        assert st != 0, f"C rendered {got!r} where jinja2 failed ({want})\ntemplate: {template!r}\ndata: {data!r}"
    return ok


# ---------------------------------------------------------------------------- chat templates

# Written for these tests in the style of the public chat templates (same constructs, own text).

KIMI_STYLE = r"""{%- macro render_content(msg) -%}
    {%- set c = msg.get('content') -%}
    {%- if c is string -%}
      {{ c }}
    {%- elif c is not none -%}
      {% for part in c -%}
        {% if part['type'] == 'image' or 'image_url' in part -%}
          <|media_begin|>image<|media_content|><|media_pad|><|media_end|>
        {% else -%}
          {{ part['text'] }}
        {%- endif -%}
      {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- macro role_header(message) -%}
  {%- set who = message.get('name') or message['role'] -%}
  {%- if message['role'] == 'user' -%}
    <|im_user|>{{ who }}<|im_middle|>
  {%- elif message['role'] == 'assistant' -%}
    <|im_assistant|>{{ who }}<|im_middle|>
  {%- else -%}
    <|im_system|>{{ who }}<|im_middle|>
  {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
  <|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}<|im_end|>
{%- endif -%}
{%- set ns = namespace(last_plain=-1) -%}
{%- for m in messages -%}
  {%- if m.role == 'assistant' and not m.get('tool_calls') -%}{%- set ns.last_plain = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- if messages|length == 0 or messages[0]['role'] != 'system' -%}
  <|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>
{%- endif -%}
{%- for message in messages -%}
  {%- if message['role'] == 'tool' -%}
    <|im_system|>tool<|im_middle|>## Return of {{ message.tool_call_id }}
{{ render_content(message) }}<|im_end|>
  {%- else -%}
    {{ role_header(message) }}
    {%- if message['role'] == 'assistant' -%}
      {%- set rc = message.get('reasoning_content') or '' -%}
      {%- if loop.index0 > ns.last_plain -%}<think>{{ rc }}</think>{%- else -%}<think></think>{%- endif -%}
      {{ render_content(message) }}
      {%- if message.get('tool_calls') -%}
        <|tool_calls_section_begin|>
        {%- for tc in message['tool_calls'] -%}
          <|tool_call_begin|>{{ tc['id'] }}<|tool_call_argument_begin|>
          {%- if tc['function']['arguments'] is string -%}{{ tc['function']['arguments'] }}
          {%- else -%}{{ tc['function']['arguments'] | tojson }}{%- endif -%}
          <|tool_call_end|>
        {%- endfor -%}
        <|tool_calls_section_end|>
      {%- endif -%}
    {%- else -%}
      {{ render_content(message) }}
    {%- endif -%}
    <|im_end|>
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  <|im_assistant|>assistant<|im_middle|>
{%- endif -%}"""

DEEPSEEK_STYLE = r"""{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}
{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {%- if ns.is_first_sp %}
            {% set ns.system_prompt = ns.system_prompt + message['content'] %}
            {% set ns.is_first_sp = false %}
        {%- else %}
            {% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{{ bos_token }}{{ ns.system_prompt }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}
        {%- set ns.is_tool = false -%}
        {{'<｜User｜>' + message['content']}}
    {%- endif %}
    {%- if message['role'] == 'assistant' and 'tool_calls' in message and message['tool_calls'] %}
        {%- set ns.is_tool = false -%}
        {%- for tool in message['tool_calls'] %}
            {%- if not ns.is_first %}
                {%- if message['content'] is none %}
                    {{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}
                {%- else %}
                    {{'<｜Assistant｜>' + message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}
                {%- endif %}
                {%- set ns.is_first = true -%}
            {%- else %}
                {{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}
            {%- endif %}
        {%- endfor %}
        {{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}
    {%- endif %}
    {%- if message['role'] == 'assistant' and ('tool_calls' not in message or not message['tool_calls']) %}
        {%- if ns.is_tool %}
            {{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}
            {%- set ns.is_tool = false -%}
        {%- else %}
            {% set content = message['content'] %}
            {% if '</think>' in content %}
                {% set content = content.split('</think>')[-1] %}
            {% endif %}
            {{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}
        {%- endif %}
    {%- endif %}
    {%- if message['role'] == 'tool' %}
        {%- set ns.is_tool = true -%}
        {%- if ns.is_output_first %}
            {{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}
            {%- set ns.is_output_first = false %}
        {%- else %}
            {{'<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}
        {%- endif %}
    {%- endif %}
{%- endfor -%}
{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}
{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\n'}}{% endif %}"""

QWEN_STYLE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call functions.\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city — °C or °F",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "城市"},
                                          "unit": {"type": "string", "enum": ["c", "f"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search \"the web\"\n",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"},
                                                                                      "n": {"type": "integer"}}}}},
]


def conversations():
    """Conversations with the shapes the templates branch on (DeepSeek wants string arguments)."""
    convs = []
    convs.append([{"role": "user", "content": "Hello!"}])
    convs.append([{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "What's 2+2? 🤔"},
                  {"role": "assistant", "content": "4", "reasoning_content": "Simple: 2+2 = 4."},
                  {"role": "user", "content": "And <|im_end|> in text?"}])
    convs.append([{"role": "system", "content": "Tools allowed."},
                  {"role": "user", "content": "Weather in Paris and Zürich?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                                   "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                                  {"id": "functions.get_weather:1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}}]},
                  {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18°C, sunny"},
                  {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "12°C, rain ☔"},
                  {"role": "assistant", "content": "<think>compare</think>\n\nParis is warmer."}])
    convs.append([{"role": "user", "content": "multi\nline\n\ttabs and \\ backslash \"quotes\" 'single'"},
                  {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nok 日本語"},
                  {"role": "user", "content": "<tool_response>x</tool_response>"}])
    convs.append([{"role": "system", "content": "A"}, {"role": "system", "content": "B"},
                  {"role": "user", "content": "x"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "c0", "type": "function",
                                   "function": {"name": "search", "arguments": "{\"q\": \"jinja\", \"n\": 3}"}}]},
                  {"role": "tool", "tool_call_id": "c0", "content": "[1, 2, 3]"}])
    return convs


def kimi_conversations():
    """Kimi's template also takes content parts, names and dict arguments."""
    convs = conversations()
    convs = [[dict(m, content=m["content"] if m["content"] is not None else "") for m in c] for c in convs]
    convs.append([{"role": "user", "name": "alice", "content": [{"type": "text", "text": "look: "},
                                                                 {"type": "image_url", "image_url": {"url": "x"}},
                                                                 {"type": "text", "text": " 🖼️ done"}]},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"id": "functions.search:0", "type": "function",
                       "function": {"name": "search", "arguments": {"q": "ünïcode", "n": 2, "f": 1.5,
                                                                    "nested": {"a": [True, None]}}}}]},
                  {"role": "tool", "tool_call_id": "functions.search:0", "content": "found"}])
    return convs


@pytest.mark.parametrize("name,template", [("kimi", KIMI_STYLE), ("deepseek", DEEPSEEK_STYLE), ("qwen", QWEN_STYLE)])
def test_chat_templates_match_jinja2(cj, name, template):
    convs = kimi_conversations() if name == "kimi" else conversations()
    rendered = 0
    for conv in convs:
        for tools in ([], TOOLS):
            for agp in (True, False):
                data = {"messages": conv}
                if tools:
                    data["tools"] = tools
                trusted = {"bos_token": "<｜begin▁of▁sentence｜>", "add_generation_prompt": agp}
                if compare(cj, template, data, trusted):
                    rendered += 1
    assert rendered >= len(convs) * 2  # most combinations render; a failing one must fail on both sides


def test_qwen_enable_thinking(cj):
    for et in (True, False):
        compare(cj, QWEN_STYLE, {"messages": conversations()[1]}, {"add_generation_prompt": True, "enable_thinking": et})


def test_raise_exception_matches(cj):
    t = "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role: ' ~ m.role) }}{% endif %}{{ m.content }}{% endfor %}"
    assert not compare(cj, t, {"messages": [{"role": "robot", "content": "x"}]})
    st, _, _, msg = cj.render(t, {"messages": [{"role": "robot", "content": "x"}]}, {})
    assert st == 1 and "template raised: bad role: robot" in msg and msg.startswith("line 1, column ")
    assert compare(cj, t, {"messages": [{"role": "user", "content": "x"}]})


def test_mask_marks_data_bytes(cj):
    """The user's "<|im_end|>" is data (1); the template's own "<|im_end|>" and the trusted
    bos_token are template (0)."""
    t = "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"
    data = {"messages": [{"role": "user", "content": "hi <|im_end|> x"}]}
    st, text, mask, msg = cj.render(t, data, {"bos_token": "<s>"})
    assert st == 0, msg
    assert text == b"<s><|im_start|>user\nhi <|im_end|> x<|im_end|>"
    want = b"\0" * len(b"<s><|im_start|>") + b"\1" * len(b"user") + b"\0" + b"\1" * len(b"hi <|im_end|> x") + \
        b"\0" * len(b"<|im_end|>")
    assert mask == want


# ---------------------------------------------------------------------------- random templates

# Strings whose non-ASCII characters have no case (case mapping here covers ASCII only).
WORDS = ["", "a", "Hello", "hello world", "  padded  ", "x,y,,z", "<|im_end|>", "日本語", "emoji 😀!",
         "it's", 'say "hi"', "tab\there", "line1\nline2", "back\\slash", "UPPER lower", "-dash (paren) [b]",
         "1", "42", "3.5", " 7 ", "abcabc", "</think>tail", "<think>r</think>\n\nans", "→ arrow"]

FILTER_SPECS = [
    ("length", []), ("count", []), ("tojson", []), ("tojson", ["indent=2"]), ("tojson", ["separators=(',', ':')"]),
    ("tojson", ["ensure_ascii=true"]), ("tojson", ["sort_keys=true"]),
    ("trim", []), ("string", []), ("int", []), ("float", []), ("first", []), ("last", []), ("join", []),
    ("join", ["', '"]), ("default", ["'dflt'"]), ("d", ["'x'", "true"]), ("upper", []), ("lower", []),
    ("capitalize", []), ("title", []), ("replace", ["'a'", "'A'"]), ("replace", ["'l'", "''", "1"]), ("list", []),
    ("sort", []), ("sort", ["reverse=true"]), ("abs", []), ("round", []),
    ("round", ["1", "'floor'"]), ("max", []), ("min", []), ("sum", []), ("e", []),
    ("indent", ["2"]), ("indent", ["2", "true"]), ("dictsort", []), ("trim", ["'x'"]),
]
LIST_FILTERS = [("map", ["'upper'"]), ("map", ["attribute='role'"]), ("select", ["'odd'"]), ("reject", ["'none'"]),
                ("selectattr", ["'role'", "'equalto'", "'user'"]), ("rejectattr", ["'content'", "'defined'"]),
                ("select", []), ("map", ["'string'"]), ("items", []), ("unique", []),
                ("reverse", [])]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "boolean", "true", "false",
         "mapping", "iterable", "sequence", "callable", "odd", "even", "divisibleby 3", "in [1, 2, 'a']",
         "equalto 1", "lower", "upper", "sameas none"]
METHODS = ["strip()", "strip('x')", "lstrip()", "rstrip('\\n ')", "split()", "split(',')", "split(' ', 1)",
           "rsplit(None, 1)", "startswith('a')", "endswith(('o', 'd'))", "upper()", "lower()", "title()",
           "capitalize()", "replace('l', 'L')", "find('l')", "count('a')", "isdigit()", "split('</think>')[-1]",
           "get('role')", "get('zz', 5)", "items()|list", "keys()|list", "values()|list", "index(1)", "count(1)"]


class Gen:
    def __init__(self, rng):
        self.r = rng
        self.loop_vars = []

    def str_lit(self):
        w = self.r.choice(WORDS)
        body = w.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
        if self.r.random() < 0.5:
            return "'" + body.replace("'", "\\'") + "'"
        return '"' + body.replace('"', '\\"') + '"'

    def literal(self, d):
        k = self.r.randrange(9)
        if k == 0:
            return str(self.r.randint(-3, 12))
        if k == 1:
            return self.r.choice(["0.5", "2.0", "-1.25", "1e-5", "3.14159", "1e20", "0.1"])
        if k in (2, 3):
            return self.str_lit()
        if k == 4:
            return self.r.choice(["true", "false", "none", "True", "None"])
        if k == 5 and d > 0:
            return "[" + ", ".join(self.expr(d - 1) for _ in range(self.r.randint(0, 3))) + "]"
        if k == 6 and d > 0:
            items = [f"{self.str_lit()}: {self.expr(d - 1)}" for _ in range(self.r.randint(0, 3))]
            return "{" + ", ".join(items) + "}"
        if k == 7 and d > 0:
            n = self.r.randint(1, 3)
            parts = [self.expr(d - 1) for _ in range(n)]
            return "(" + ", ".join(parts) + ("," if n == 1 else "") + ")"
        return self.name()

    def name(self):
        pool = ["s", "n", "f", "l", "ls", "d", "msgs", "b", "z", "nope", "ns.v", "tmp", "acc"] + self.loop_vars
        return self.r.choice(pool)

    def expr(self, d=3):
        r = self.r
        if d <= 0:
            return self.literal(0)
        k = r.randrange(16)
        if k < 3:
            return self.literal(d)
        if k == 3:
            post = r.choice([".role", ".content", ".a", "[0]", "[-1]", "[1:]", "[::-1]", "[:2]", '["a"]', ".missing"])
            # jinja2 folds constant subexpressions at compile time, where a failed slice becomes
            # undefined instead of an error: subscript names, as templates do
            return self.name() + post
        if k == 4:
            op = r.choice(["+", "-", "*", "~", "~", "/", "//"])
            return f"({self.expr(d - 1)} {op} {self.expr(d - 1)})"
        if k == 5:
            return f"({r.randint(-9, 9)} {r.choice(['%', '**', '//'])} {r.randint(1, 4)})"
        if k == 6:
            op = r.choice(["==", "!=", "<", ">=", "in", "not in"])
            return f"({self.expr(d - 1)} {op} {self.expr(d - 1)})"
        if k == 7:
            return f"({self.expr(d - 1)} {r.choice(['and', 'or'])} {self.expr(d - 1)})"
        if k == 8:
            return f"(not {self.expr(d - 1)})"
        if k == 9:
            els = f" else {self.expr(d - 1)}" if r.random() < 0.8 else ""
            return f"({self.expr(d - 1)} if {self.expr(d - 1)}{els})"
        if k in (10, 11):
            name, args = r.choice(FILTER_SPECS)
            a = "(" + ", ".join(args) + ")" if args or r.random() < 0.2 else ""
            return f"({self.expr(d - 1)}|{name}{a})"
        if k == 12:
            name, args = r.choice(LIST_FILTERS)
            return f"({self.expr(d - 1)}|{name}({', '.join(args)})|list)"
        if k == 13:
            neg = "not " if r.random() < 0.3 else ""
            return f"({self.expr(d - 1)} is {neg}{r.choice(TESTS)})"
        if k == 14:
            return f"{self.expr(d - 1)}.{r.choice(METHODS)}"
        return r.choice([f"range({r.randint(0, 5)})|list", f"(range(1, {r.randint(1, 9)}, 2)|list)",
                         "namespace(v=1).v", f"dict(k={self.expr(d - 1)})", "(-n)", "(-f)"])

    def text(self):
        return self.r.choice(["", "x", " ", "\n", "  \n", "\n  ", "text ", "<|im_start|>", "a\n\n", "\t"])

    def tag(self, body):
        """{% body %} with random whitespace control."""
        l = self.r.choice(["", "", "-", "+"])
        rr = self.r.choice(["", "", "-"])
        return "{%" + l + " " + body + " " + rr + "%}"

    def out(self, e):
        l = self.r.choice(["", "", "-"])
        rr = self.r.choice(["", "", "-"])
        return "{{" + l + " " + e + " " + rr + "}}"

    def block(self, d):
        parts = []
        for _ in range(self.r.randint(1, 3)):
            parts.append(self.text())
            parts.append(self.stmt(d))
        parts.append(self.text())
        return "".join(parts)

    def stmt(self, d):
        r = self.r
        k = r.randrange(10) if d > 0 else 0
        if k <= 2:
            return self.out(self.expr(r.randint(1, 3)))
        if k == 3:
            s = self.tag(f"if {self.expr(2)}") + self.block(d - 1)
            if r.random() < 0.4:
                s += self.tag(f"elif {self.expr(2)}") + self.block(d - 1)
            if r.random() < 0.5:
                s += self.tag("else") + self.block(d - 1)
            return s + self.tag("endif")
        if k == 4:
            var = r.choice(["i", "item", "x"])
            it = r.choice(["l", "ls", "msgs", "s", "d", "range(3)", "d.items()", "z", "nope", "[1, 2, 3]", self.expr(2)])
            target = var
            if it == "d.items()":
                target = "k, v"
            cond = f" if {self.expr(1)}" if r.random() < 0.2 else ""
            self.loop_vars += target.split(", ") + ["loop.index", "loop.first", "loop.last", "loop.length",
                                                    "loop.revindex0", "loop.previtem", "loop.cycle('a', 'b')"]
            body = self.block(d - 1)
            if r.random() < 0.3:
                body += self.tag(f"if {self.expr(1)}") + self.tag(r.choice(["break", "continue"])) + self.tag("endif")
            els = self.tag("else") + self.block(d - 1) if r.random() < 0.2 else ""
            for _ in range(len(target.split(", ")) + 7):
                self.loop_vars.pop()
            return self.tag(f"for {target} in {it}{cond}") + body + els + self.tag("endfor")
        if k == 5:
            # jinja2 quirk left out: a loop reading a context name that the top level assigns
            # later sees it undefined; so the targets here are not context names
            return self.tag(f"set {r.choice(['tmp', 'acc'])} = {self.expr(2)}")
        if k == 6:
            return self.tag(f"set ns.v = {self.expr(2)}")
        if k == 7:
            return self.tag("set cap") + self.block(d - 1) + self.tag("endset") + self.out("cap")
        if k == 8:
            return (self.tag("macro mm(p, q='dq')") + self.out("p") + self.text() + self.out("q") + self.tag("endmacro")
                    + self.out(f"mm({self.expr(1)})") + self.out(f"mm({self.expr(1)}, q={self.expr(1)})"))
        return "{# " + r.choice(["c", "comment {{ x }}", ""]) + " #}" + self.text()

    def template(self):
        return self.tag("set ns = namespace(v=0)") + self.block(3)


def rand_json(r, d=2):
    k = r.randrange(7)
    if k == 0:
        return r.randint(-5, 20)
    if k == 1:
        return r.choice([0.5, -2.0, 1e-7, 12.25])
    if k in (2, 3):
        return r.choice(WORDS)
    if k == 4:
        return r.choice([True, False, None])
    if k == 5 and d > 0:
        return [rand_json(r, d - 1) for _ in range(r.randint(0, 3))]
    if d > 0:
        return {r.choice(["a", "b", "role", "content", "k"]): rand_json(r, d - 1) for _ in range(r.randint(0, 3))}
    return r.choice(WORDS)


def rand_context(r):
    roles = ["user", "assistant", "system", "tool"]
    return {
        "s": r.choice(WORDS), "n": r.randint(-3, 10), "f": r.choice([0.5, 2.0, -1.5, 1e16, 123.456]),
        "l": [r.randint(-2, 9) for _ in range(r.randint(0, 4))],
        "ls": [r.choice(WORDS) for _ in range(r.randint(0, 4))],
        "d": {w: rand_json(r, 1) for w in r.sample(["a", "b", "role", "Z", "content"], r.randint(0, 4))},
        "msgs": [{"role": r.choice(roles), "content": r.choice(WORDS)} for _ in range(r.randint(0, 3))],
        "b": r.choice([True, False]), "z": None, "j": rand_json(r, 3),
    }


def test_random_templates_match_jinja2(cj):
    rng = random.Random(20240611)
    n = 120 if quick() else 600
    agreed_text = 0
    for case in range(n):
        g = Gen(rng)
        tpl = g.template()
        ctx = rand_context(rng)
        trusted = {"add_generation_prompt": rng.choice([True, False])}
        if compare(cj, tpl, ctx, trusted):
            agreed_text += 1
    # the grammar is meant to render more often than not; a drop means it tests less than it claims
    assert agreed_text > n // 3, f"only {agreed_text} of {n} random templates rendered"


def test_random_expressions_match_jinja2(cj):
    rng = random.Random(7)
    n = 150 if quick() else 800
    ok = 0
    for _ in range(n):
        e = Gen(rng).expr(rng.randint(1, 4))
        tpl = "{% set ns = namespace(v=0) %}{{ " + e + " }}"
        if compare(cj, tpl, rand_context(rng)):
            ok += 1
    assert ok > n // 3, f"only {ok} of {n} random expressions rendered"
