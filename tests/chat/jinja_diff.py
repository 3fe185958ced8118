#!/usr/bin/python3
"""Differential cases for the Jinja interpreter (chat/jinja_*).

Each case is a small template (and optional variables) rendered by jinja2
in transformers' environment (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, tojson = json.dumps(ensure_ascii=False),
raise_exception, strftime_now pinned to 2026-07-26 12:00 UTC).

  jinja_diff.py --write   regenerate tests/chat/jinja_cases.h (the table the
                          C test test_jinja_semantics checks; expectations
                          came from jinja2 3.1.2, Debian's python3-jinja2)
  jinja_diff.py           check the table is current (exit 77 without jinja2)
"""
import json, os, sys

CASES = [
    # --- printing (Python str/repr) ---
    ("{{ 1 }}|{{ 1.0 }}|{{ -0.5 }}|{{ 1e20 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ 1/3 }}", {}),
    ("{{ true }}|{{ false }}|{{ none }}|{{ None }}|{{ True }}", {}),
    ("{{ [1, 'a', 2.5, none, true] }}|{{ {'k': 'v', 'n': 1} }}|{{ ('a',) }}|{{ (1, 2) }}", {}),
    ("{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', 'tab\\t', 'bs\\\\'] }}", {}),
    ("{{ x }}|{{ x.y if x is defined }}|{{ d }}|{{ l }}", {"d": {"a": [1, {"b": None}]}, "l": [[], {}]}),
    ("{{ 3.0 * 2 }}|{{ 7 / 2 }}|{{ 6 / 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 7.5 // 2 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 2.0 ** 3 }}", {}),
    ("{{ 1 + true }}|{{ 0.1 + 0.2 }}|{{ 1e300 * 1e10 }}|{{ -(3) }}|{{ +4 }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ 2.0 ~ true ~ [1] }}", {}),
    # --- whitespace control, trim_blocks, lstrip_blocks ---
    ("a\n{% if true %}\nb\n{% endif %}\nc\n", {}),
    ("a\n    {% if true %}\n    b\n    {% endif %}\nc", {}),
    ("  {{ 'x' }}  \n  {% if 1 %}y{% endif %}  \n", {}),
    ("a  {%- if true -%}  b  {%- endif -%}  c", {}),
    ("a {{- ' b ' -}} c", {}),
    ("a\n  {#- comment -#}\n  b\n  {# c2 #}\nd", {}),
    ("x {%+ if true %}y{% endif +%}\nz", {}),
    ("{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n", {}),
    ("\t  {% set x = 1 %}\t\n{{ x }}", {}),
    ("{% raw %}{{ not evaluated }}{% endraw %}|{%- raw -%}  {% x %}  {%- endraw -%}|", {}),
    ("line1\r\n{% if true %}\r\nline2{% endif %}", {}),
    # --- scoping ---
    ("{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i + 5 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% if true %}{% set y = 2 %}{% endif %}{{ y }}", {}),
    ("{% set ns = namespace(n=0, items=[]) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", {}),
    ("{% for a in [1] %}{% set inner = 5 %}{% endfor %}{{ inner is defined }}", {}),
    ("{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}", {}),
    ("{% macro m(a, b='B') %}[{{ a }}{{ b }}{{ varargs }}{{ kwargs }}]{% endmacro %}{{ m(1) }}{{ m(1, 2, 3, z=4) }}{{ m(b=5, a=6) }}", {}),
    ("{% set g = 'G' %}{% macro m() %}{{ g }}{% set g = 'L' %}{{ g }}{% endmacro %}{{ m() }}{{ g }}", {}),
    ("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inside{% endcall %}", {}),
    ("{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}", {}),
    ("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a is defined }}", {}),
    ("{% set block %}in {{ 1 + 1 }}{% endset %}[{{ block }}]{% set up | upper %}shout{% endset %}{{ up }}", {}),
    ("{% filter upper %}abc {{ 'd' }}{% endfilter %}", {}),
    # --- loops ---
    ("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ x }};{% endfor %}", {}),
    ("{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('a', 'b') }};{% endfor %}", {}),
    ("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.index }}{{ loop.last }};{% endfor %}", {}),
    ("{% for x in [] %}no{% else %}empty{% endfor %}|{% for x in [1] %}one{% else %}no{% endfor %}", {}),
    ("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}", {}),
    ("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("{{ range(5) | list }}{{ range(1, 10, 3) | list }}{{ range(5, 0, -2) | list }}{{ range(0) | list }}", {}),
    ("{% for x in u %}never{% endfor %}ok", {}),
    # --- expressions ---
    ("{{ 1 < 2 < 3 }}{{ 1 < 3 < 2 }}{{ 2 == 2.0 }}{{ 'a' != 'b' }}{{ [1, 2] == [1, 2] }}{{ 'b' > 'a' }}", {}),
    ("{{ 'a' in 'cat' }}{{ 'z' not in 'cat' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 1 in u }}", {}),
    ("{{ 0 or 'x' }}|{{ 'a' and 'b' }}|{{ '' and 'b' }}|{{ none or [] }}|{{ not 0 }}|{{ not 'a' }}", {}),
    ("{{ 'yes' if 1 else 'no' }}|{{ 'yes' if 0 else 'no' }}|{{ 'yes' if 0 }}|{{ 'a' if false else 'b' if true else 'c' }}", {}),
    ("{{ 'hello'[1] }}{{ 'hello'[-1] }}{{ 'hello'[1:3] }}{{ 'hello'[::-1] }}{{ 'hello'[::2] }}{{ 'hello'[-3:] }}{{ 'hello'[:-1] }}{{ 'hello'[10:] }}", {}),
    ("{{ [1, 2, 3, 4, 5][1:4] }}{{ [1, 2, 3, 4, 5][::-2] }}{{ [1, 2, 3][5:] }}{{ [1, 2, 3][-2] }}{{ (1, 2, 3)[1:] }}", {}),
    ("{{ 'grüße'[1:4] }}|{{ 'grüße' | length }}|{{ '日本語'[-1] }}|{{ '🙂x'[0] }}", {}),
    ("{{ d.a }}{{ d['a'] }}{{ d.missing }}|{{ d.items is callable }}|{{ d['items'] }}|{{ l.0 }}", {"d": {"a": 1, "items": "I"}, "l": ["z"]}),
    ("{{ 'a' 'b' }}{{ \"x\\ny\" }}{{ '\\u00e9\\x41' }}", {}),
    ("{{ [1, 2] + [3] }}{{ 'ab' * 3 }}{{ [0] * 3 }}{{ 3 * 'x' }}", {}),
    ("{{ {'a': 1, 'b': 2} | length }}{{ ([1, 2], 3) | length }}", {}),
    ("{{ 1_000 + 0x10 if false else 1_000 }}", {}),
    # --- filters ---
    ("{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ none | trim }}|{{ 12 | string }}|{{ 'abc' | upper }}{{ 'ABC' | lower }}", {}),
    ("{{ 'hello world' | capitalize }}|{{ 'hello wORLD-foo (bar)' | title }}|{{ 'aaa' | replace('a', 'b', 2) }}", {}),
    ("{{ [3, 1, 2] | sort }}{{ [3, 1, 2] | sort(reverse=true) }}{{ ['b', 'A', 'c'] | sort }}{{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}", {}),
    ("{{ users | sort(attribute='age') | map(attribute='name') | join(', ') }}", {"users": [{"name": "a", "age": 30}, {"name": "b", "age": 20}, {"name": "c", "age": 25}]}),
    ("{{ users | selectattr('age', 'gt', 21) | map(attribute='name') | list }}{{ users | rejectattr('age', 'equalto', 20) | map(attribute='name') | list }}", {"users": [{"name": "a", "age": 30}, {"name": "b", "age": 20}]}),
    ("{{ msgs | selectattr('role', 'equalto', 'user') | list | length }}{{ msgs | map(attribute='role') | unique | list }}{{ msgs | selectattr('tool') | list }}", {"msgs": [{"role": "user"}, {"role": "assistant"}, {"role": "user"}]}),
    ("{{ [1, 2, 3, 4] | select('odd') | list }}{{ [1, 2, 3, 4] | reject('odd') | list }}{{ [0, 1, '', 'a'] | select | list }}{{ ['a', 'b'] | map('upper') | list }}", {}),
    ("{{ [1, 2] | first }}{{ [1, 2] | last }}{{ [] | first }}{{ 'abc' | first }}{{ 'abc' | list }}{{ {'a': 1} | list }}", {}),
    ("{{ x | default('d') }}|{{ none | default('d') }}|{{ '' | default('d', true) }}|{{ 0 | d('z', boolean=true) }}|{{ 'v' | default('d') }}", {}),
    ("{{ {'b': 1, 'a': 2} | dictsort }}{{ {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) }}{{ {'a': 1} | items | list }}", {}),
    ("{{ [1, 2, 2, 1] | unique | list }}{{ ['a', 'A'] | unique | list }}{{ [1, 2] | reverse | list }}{{ 'abc' | reverse }}", {}),
    ("{{ '42' | int }}{{ '4.7' | int }}{{ 'x' | int }}{{ 'x' | int(7) }}{{ 3.9 | int }}{{ '2.5' | float }}{{ 'x' | float }}{{ 2 | float }}{{ -3 | abs }}", {}),
    ("{{ 2.5 | round }}{{ 3.5 | round }}{{ 2.567 | round(2) }}{{ 2.1 | round(0, 'ceil') }}{{ 2.9 | round(method='floor') }}{{ 3 | round }}", {}),
    ("{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(1, blank=true) }}", {}),
    ("{{ ['a', 'b'] | join }}{{ [1, 2] | join('-') }}{{ users | join(', ', attribute='n') }}", {"users": [{"n": "x"}, {"n": "y"}]}),
    ("{{ 'one two  three' | wordcount }}{{ 'ab' | center(6) }}|{{ '<a href=\"x\">&\\'' | e }}|{{ 'x' | safe }}", {}),
    ("{{ [1, 2, 3, 4, 5] | batch(2) | list }}{{ [1, 2, 3] | batch(2, 0) | list }}{{ [3, 1, 2] | max }}{{ [3, 1, 2] | min }}{{ [1, 2, 3] | sum }}", {}),
    ("{{ '%s is %d years' | format('Al', 30) }}|{{ '%s-%s' % ('a', 'b') }}|{{ '%05.1f' % 3.14159 }}", {}),
    # --- tojson (transformers: json.dumps(ensure_ascii=False)) ---
    ("{{ obj | tojson }}", {"obj": {"a": [1, 2.5, None, True, "é\"\\\n\t\u0001"], "b": {}, "c": []}}),
    ("{{ obj | tojson(indent=2) }}", {"obj": {"a": [1, {"x": []}], "b": {"c": "d"}, "e": {}}}),
    ("{{ obj | tojson(indent=4) }}|{{ [] | tojson(indent=2) }}|{{ 'x' | tojson }}|{{ 1.0 | tojson }}|{{ 1e20 | tojson }}", {"obj": [1, [2, [3]]]}),
    ("{{ obj | tojson(sort_keys=true) }}|{{ obj | tojson(separators=(',', ':')) }}", {"obj": {"b": 1, "a": [1, 2]}}),
    ("{{ {1: 'a', true: 'b', none: 'c'} | tojson }}", {}),
    # --- tests ---
    ("{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}", {}),
    ("{{ 1 is number }}{{ 1.5 is number }}{{ true is number }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ true is true }}{{ 1 is true }}{{ false is false }}", {}),
    ("{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 'a' is eq 'a' }}{{ 2 is gt 1 }}{{ 2 is le 1 }}{{ 1 is in [1] }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 1 is ne 2 }}", {}),
    ("{{ x is not defined }}{{ not x is defined }}{{ [] is sequence }}{{ 'x' is sequence }}{{ none is sameas none }}{{ range is callable }}", {}),
    # --- str methods ---
    ("{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x\\n\\n'.rstrip() }}|{{ '\\n\\nx'.lstrip('\\n') }}|{{ 'abcba'.rstrip('ab') }}", {}),
    ("{{ 'a,b,,c'.split(',') }}{{ '  a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}{{ 'a b c'.split(none, 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ''.split() }}{{ ''.split(',') }}", {}),
    ("{{ 'hello'.startswith('he') }}{{ 'hello'.endswith('lo') }}{{ 'hello'.startswith(('x', 'h')) }}{{ 'hello'.endswith(('x', 'y')) }}{{ 'hello'.startswith('l', 2) }}", {}),
    ("{{ 'Hello World'.upper() }}{{ 'Hello World'.lower() }}{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}{{ 'a-b'.replace('-', '+') }}", {}),
    ("{{ 'hello'.find('l') }}{{ 'hello'.find('z') }}{{ 'hello'.rfind('l') }}{{ 'hello'.count('l') }}{{ '-'.join(['a', 'b']) }}{{ 'grüße'.find('e') }}", {}),
    ("{{ 'a\\nb\\r\\nc'.splitlines() }}{{ 'x{}y{}'.format(1, 'z') }}{{ '{0}{0}'.format('r') }}{{ '{n}!'.format(n=3) }}", {}),
    ("{{ '123'.isdigit() }}{{ 'abc'.isalpha() }}{{ ' '.isspace() }}{{ 'ab'.islower() }}{{ 'AB'.isupper() }}", {}),
    # --- dict/list methods ---
    ("{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 'dflt') }}{{ d.keys() | list }}{{ d.values() | list }}{{ d.items() | list }}", {"d": {"a": 1, "b": 2}}),
    ("{{ [1, 2, 3].index(2) }}{{ [1, 1, 2].count(1) }}", {}),
    # --- globals ---
    ("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%A %B %-d %I %p %j %y') }}", {}),
    ("{% set d = dict(a=1, b='x') %}{{ d }}{% set ns = namespace(a=1) %}{% set ns.b = 2 %}{{ ns.a }}{{ ns.b }}", {}),
    ("{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{% set j = joiner('|') %}{{ j() }}1{{ j() }}2", {}),
    # --- errors (message must contain the text after ERR) ---
    ("{{ raise_exception('custom failure') }}", {}),
    ("{{ x.y }}", {}),
    ("{{ d.missing.deeper }}", {"d": {}}),
    ("{{ l[5].x }}", {"l": [1]}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ 1 + 'a' }}", {}),
    ("{{ x + 1 }}", {}),
    ("{{ x() }}", {}),
    ("{{ 1 < 'a' }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ 5 // 0 }}", {}),
    ("{{ range(100001) | length }}", {}),
    ("{% set l = [] %}{{ l.append(1) }}", {}),
    ("{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("{% set x = 1 %}{% set x.y = 2 %}", {}),
    ("{{ none | tojson }}{{ x | tojson }}", {}),
    ("{{ 'abc'[::0] }}", {}),
    ("{% for x in 5 %}{% endfor %}", {}),
    ("{{ 1 in none }}", {}),
    ("{{ -'a' }}", {}),
]

# --- realistic templates (written for these tests in the style of real
# model templates: DeepSeek-R1 distill, Qwen2.5 tools, Hermes tool_use,
# Mistral v0.3 tools, Zephyr, Phi-3) rendered over full requests ---
DEEPSEEK = ("{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}"
    "{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{ '<\uff5cUser\uff5c>' + message['content'] }}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}"
    "{%- for tool in message['tool_calls'] %}{%- if not ns.is_first %}"
    "{{ '<\uff5cAssistant\uff5c><\uff5ctool\u2581calls\u2581begin\uff5c>' + tool['type'] + '<\uff5ctool\u2581sep\uff5c>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<\uff5ctool\u2581call\u2581end\uff5c>' }}"
    "{%- set ns.is_first = true -%}{%- else %}"
    "{{ '\\n' + '<\uff5ctool\u2581call\u2581begin\uff5c>' + tool['type'] + '<\uff5ctool\u2581sep\uff5c>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<\uff5ctool\u2581call\u2581end\uff5c>' }}"
    "{{ '<\uff5ctool\u2581calls\u2581end\uff5c><\uff5cend\u2581of\u2581sentence\uff5c>' }}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    "{%- if ns.is_tool %}{{ '<\uff5ctool\u2581outputs\u2581end\uff5c>' + message['content'] + '<\uff5cend\u2581of\u2581sentence\uff5c>' }}{%- set ns.is_tool = false -%}"
    "{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<\uff5cAssistant\uff5c>' + content + '<\uff5cend\u2581of\u2581sentence\uff5c>' }}{%- endif %}{%- endif %}"
    "{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}"
    "{%- if ns.is_output_first %}{{ '<\uff5ctool\u2581outputs\u2581begin\uff5c><\uff5ctool\u2581output\u2581begin\uff5c>' + message['content'] + '<\uff5ctool\u2581output\u2581end\uff5c>' }}{%- set ns.is_output_first = false %}"
    "{%- else %}{{ '\\n<\uff5ctool\u2581output\u2581begin\uff5c>' + message['content'] + '<\uff5ctool\u2581output\u2581end\uff5c>' }}{%- endif %}{%- endif %}"
    "{%- endfor -%}"
    "{% if ns.is_tool %}{{ '<\uff5ctool\u2581outputs\u2581end\uff5c>' }}{% endif %}"
    "{% if add_generation_prompt and not ns.is_tool %}{{ '<\uff5cAssistant\uff5c><think>\\n' }}{% endif %}")

QWEN = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

HERMES = """{%- macro json_to_python_type(json_spec) %}
{%- set basic_type_map = {
    "string": "str",
    "number": "float",
    "integer": "int",
    "boolean": "bool"
} %}

{%- if basic_type_map[json_spec.type] is defined %}
    {{- basic_type_map[json_spec.type] }}
{%- elif json_spec.type == "array" %}
    {{- "list[" +  json_to_python_type(json_spec["items"]) + "]"}}
{%- elif json_spec.type == "object" %}
    {%- if json_spec.additionalProperties is defined %}
        {{- "dict[str, " + json_to_python_type(json_spec.additionalProperties) + ']'}}
    {%- else %}
        {{- "dict" }}
    {%- endif %}
{%- elif json_spec.type is iterable %}
    {{- "Union[" }}
    {%- for t in json_spec.type %}
      {{- json_to_python_type({"type": t}) }}
      {%- if not loop.last %}
        {{- "," }}
    {%- endif %}
    {%- endfor %}
    {{- "]" }}
{%- else %}
    {{- "Any" }}
{%- endif %}
{%- endmacro %}


{{- bos_token }}
{{- '<|im_start|>system\\n' }}
{{- "You are a function calling AI model. Here are the available tools: <tools> " }}
{%- for tool in tools %}
    {%- if tool.function is defined %}
        {%- set tool = tool.function %}
    {%- endif %}
    {{- '{"type": "function", "function": ' }}
    {{- '{"name": "' + tool.name + '", ' }}
    {{- '"description": "' + tool.name + '(' }}
    {%- for param_name, param_fields in tool.parameters.properties|items %}
        {{- param_name + ": " + json_to_python_type(param_fields) }}
        {%- if not loop.last %}
            {{- ", " }}
        {%- endif %}
    {%- endfor %}
    {{- ")" }}
    {%- if tool.return is defined %}
        {{- " -> " + json_to_python_type(tool.return) }}
    {%- endif %}
    {{- " - " + tool.description + "\\n\\n" }}
    {%- for param_name, param_fields in tool.parameters.properties|items %}
        {%- if loop.first %}
            {{- "    Args:\\n" }}
        {%- endif %}
        {{- "        " + param_name + "(" + json_to_python_type(param_fields) + "): " + param_fields.description|trim }}
    {%- endfor %}
    {{- '", ' }}
    {{- '"parameters": ' }}
    {%- if tool.parameters.properties | length == 0 %}
        {{- "{}" }}
    {%- else %}
        {{- tool.parameters|tojson }}
    {%- endif %}
    {{- "}" }}
    {%- if not loop.last %}
        {{- "\\n" }}
    {%- endif %}
{%- endfor %}
{{- " </tools>" }}
{{- "<|im_end|>\\n" }}
{%- for message in messages %}
    {%- if message.role == "user" or message.role == "system" or (message.role == "assistant" and message.tool_calls is not defined) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
    {%- for tool_call in message.tool_calls %}
       {{- '\\n<tool_call>\\n' }}           {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '{' }}
            {{- '"name": "' }}
            {{- tool_call.name }}
            {{- '"' }}
            {{- ', '}}
            {%- if tool_call.arguments is defined %}
                {{- '"arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments|tojson }}
                {%- endif %}
            {%- endif %}
             {{- '}' }}
            {{- '\\n</tool_call>' }}
    {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>tool\\n' }}
        {%- endif %}
        {{- '<tool_response>\\n' }}
        {{- message.content }}
        {%- if not loop.last %}
            {{- '\\n</tool_response>\\n' }}
        {%- else %}
            {{- '\\n</tool_response>' }}
        {%- endif %}
        {%- if not loop.last and loop.nextitem.role != "tool" %}
            {{- '<|im_end|>' }}
        {%- elif loop.last %}
            {{- '<|im_end|>' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

MISTRAL_V3 = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

ZEPHYR = "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"

PHI3 = "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"

GRANITE_LIKE = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = "Knowledge Cutoff Date: April 2024.\\nToday's Date: " + strftime_now('%B %d, %Y') + ".\\nYou are Granite." %}
    {%- if tools and documents %}
        {%- set system_message = system_message + " You have tools and documents." %}
    {%- elif tools %}
        {%- set system_message = system_message + " You have tools." %}
    {%- elif documents %}
        {%- set system_message = system_message + " You have documents." %}
    {%- endif %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_of_text|>\\n' }}
{%- if tools %}
    {{- '<|start_of_role|>tools<|end_of_role|>' }}
    {{- tools | tojson(indent=4) }}
    {{- '<|end_of_text|>\\n' }}
{%- endif %}
{%- if documents %}
    {%- for document in documents %}
        {{- '<|start_of_role|>document {"document_id": "' + document['doc_id'] | string + '"}<|end_of_role|>\\n' }}
        {{- document['text'] }}
        {{- '<|end_of_text|>\\n' }}
    {%- endfor %}
{%- endif %}
{%- for message in loop_messages %}
    {{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content'] + '<|end_of_text|>\\n' }}
    {%- if loop.last and add_generation_prompt %}
        {{- '<|start_of_role|>assistant' }}
        {%- if controls %}
            {{- ' ' + controls | tojson() }}
        {%- endif %}
        {{- '<|end_of_role|>' }}
    {%- endif %}
{%- endfor %}"""

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather.  ",
          "parameters": {"type": "object", "properties": {
              "city": {"type": "string", "description": "The city name. "},
              "days": {"type": "integer", "description": "How many days"},
              "units": {"type": ["string", "integer"], "description": "c or f"},
              "hours": {"type": "array", "items": {"type": "number"}, "description": "hours"},
              "extra": {"type": "object", "additionalProperties": {"type": "boolean"}, "description": "x"}},
              "required": ["city"]}, "return": {"type": "string"}}}]

CONV_TOOLS = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris \u00e9t\u00e9?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "abc123def", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "content": "{\"temp\": 21.5}", "tool_call_id": "abc123def"},
    {"role": "assistant", "content": "<think>hmm</think>It is 21.5 C."},
    {"role": "user", "content": "Thanks!"},
]
CONV_PLAIN = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! \U0001F642"},
    {"role": "user", "content": "Bye\n"},
]
CONV_STRARGS = [
    {"role": "user", "content": "call it"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "abc123def", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}},
                                                         {"id": "xyz987uvw", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
    {"role": "tool", "content": "sunny", "tool_call_id": "abc123def"},
    {"role": "tool", "content": "rain", "tool_call_id": "xyz987uvw"},
]

def req(messages, tools=None, agp=True, kwargs=None, documents=None):
    r = {"messages": messages, "add_generation_prompt": agp}
    if tools is not None:
        r["tools"] = tools
    if documents is not None:
        r["documents"] = documents
    kw = {"bos_token": "<s>", "eos_token": "</s>"}
    kw.update(kwargs or {})
    r["chat_template_kwargs"] = kw
    return r

CASES += [
    (DEEPSEEK, req(CONV_PLAIN)),
    (DEEPSEEK, req(CONV_STRARGS, agp=False)),
    (QWEN, req(CONV_PLAIN)),
    (QWEN, req(CONV_TOOLS, tools=TOOLS)),
    (QWEN, req(CONV_STRARGS, tools=TOOLS, agp=False)),
    (HERMES, req(CONV_TOOLS[1:], tools=TOOLS)),
    (HERMES, req(CONV_STRARGS, tools=TOOLS)),
    (MISTRAL_V3, req(CONV_PLAIN)),
    (MISTRAL_V3, req([m for m in CONV_TOOLS if m["role"] != "assistant" or m.get("tool_calls")] , tools=TOOLS, agp=False)),
    (MISTRAL_V3, req([{"role": "assistant", "content": "x"}])),
    (ZEPHYR, req(CONV_PLAIN)),
    (ZEPHYR, req(CONV_PLAIN, agp=False)),
    (PHI3, req(CONV_PLAIN, agp=False)),
    (GRANITE_LIKE, req(CONV_PLAIN[1:], tools=TOOLS, kwargs={"controls": {"length": "short"}})),
    (GRANITE_LIKE, req(CONV_PLAIN[1:], documents=[{"doc_id": 1, "text": "Doc one."}, {"doc_id": "b", "text": "Two"}])),
]

CASES += [
    # --- more whitespace corner cases ---
    ("   {% if true %}x{% endif %}", {}),
    ("abc   {% if true %}x{% endif %}   def", {}),
    ("{{ 1 }}   {% if true %}x{% endif %}", {}),
    ("a\n\t \t{% for i in [1, 2] %}\n\t{{ i }}\n\t{% endfor %}\n", {}),
    ("a\n  {{ 'v' }}\n  {% set x = 1 %}\n  b", {}),
    ("{% if true -%}\n\n  x  \n\n{%- endif %}|", {}),
    ("{%- if true %}  a  {% endif -%}  \n\n  b", {}),
    ("a {#- c #} b {# c -#} c\n{# line #}\nd", {}),
    ("{% for i in [1, 2] -%}\n  {{ i }}\n{%- endfor %}", {}),
    ("x\n{%- set a = 1 -%}\ny\n{{- a -}}\nz", {}),
    ("{% if true %}\r\n  a\r\n{% endif %}\r\n", {}),
    ("{{ '{{' }}{{ '}}' }}{{ '{%' }}{{ {'a': {'b': 1}} }}", {}),
    ("{%- macro m() -%}\n  body\n{%- endmacro -%}\n[{{ m() }}]", {}),
    # --- unicode strings ---
    ("{{ '\u00e9t\u00e9 \u00c0 \u00df'|upper }}|{{ '\u00c9T\u00c9 \u0391\u0392\u0393'|lower }}|{{ '\u0434\u0430 \u043d\u0435\u0442'|title }}|{{ '\u00e9cole'|capitalize }}", {}),
    ("{{ '\u3000 a \u00a0'.strip() }}|{{ 'a\u2028b'.splitlines() }}|{{ '\u00e9\u00e8'|length }}|{{ '\u00e9\u00e8'|reverse }}|{{ '\u65e5\u672c'|list }}", {}),
    ("{{ 'x\u00e9y' | tojson }}|{{ ['\u00e9'] }}|{{ '\u00e9' ~ 1 }}|{{ 'a\u0085b'.split() }}", {}),
    # --- more semantics ---
    ("{% set d = {'b': 1, 'a': 2} %}{% for k in d %}{{ k }}{% endfor %}{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}", {}),
    ("{{ (1, 2) == [1, 2] }}{{ [] == [] }}{{ {} == {} }}{{ none == none }}{{ 1 == true }}{{ 0 == false }}{{ 'a' == 'a' }}", {}),
    ("{{ messages | length }}{{ tools is none }}{{ documents is none }}{{ add_generation_prompt }}", {}),
    ("{% set n = namespace(l=[]) %}{% set n.l = n.l + [1] %}{% set n.l = n.l + [2] %}{{ n.l }}", {}),
    ("{% for m in msgs %}{% if loop.first %}first:{% endif %}{{ m }}{{ ',' if not loop.last }}{% endfor %}", {"msgs": ["a", "b", "c"]}),
    ("{{ msgs[-1] }}{{ msgs[0:1] }}{{ msgs | first | upper }}{{ (msgs | last)[0] }}", {"msgs": ["ab", "cd"]}),
    ("{% if x is defined and x %}yes{% elif y is not defined %}no-y{% else %}else{% endif %}", {}),
    ("{{ 'a' if 'b' in 'abc' and not 'z' in 'abc' else 'c' }}", {}),
    ("{{ 10 - 2 - 3 }}{{ 2 ** 3 ** 2 }}{{ -2 ** 2 }}{{ (1 + 2) * 3 }}{{ 1 + 2 * 3 }}{{ 7 % 4 ~ 'x' }}", {}),
    ("{{ 'abc' | replace('', '-') }}{{ 'aXbXc'.split('X') | join('+') }}{{ 'a' in ['a'] | list }}", {}),
    ("{{ [1, [2, 3]] | tojson }}{{ {'a': none} | tojson(indent=1) }}{{ 'tab\\there' | tojson }}", {}),
    ("{{ 3 | string + 'x' }}{{ [1, 2] | string }}{{ none | string }}{{ 1.5 | string }}", {}),
    ("{{ '%.2f' % 3.14159 }}|{{ '%d%%' % 50 }}|{{ '%s' % none }}|{{ '%r' % 'q' }}|{{ '%5s|%-5s|' % ('a', 'b') }}", {}),
    ("{{ [3, 1, 2] | sort | first }}{{ [{'n': 2}, {'n': 1}] | sort(attribute='n') | map(attribute='n') | join }}", {}),
    ("{{ [1, 2, 3] | map('string') | join('-') }}{{ ['a', 'B'] | map('lower') | list }}{{ [' a ', 'b '] | map('trim') | list }}", {}),
    ("{{ {'a': {'b': {'c': 5}}} | attr('a') }}|{{ [{'a': {'b': 1}}, {'a': {'b': 2}}] | map(attribute='a.b') | list }}", {}),
    ("{{ [{'x': 1}, {'y': 2}] | map(attribute='x', default='D') | list }}{{ [{'x': 1}, {}] | selectattr('x', 'defined') | list }}", {}),
    ("{{ 'Hello' is string and 'Hello' is not number }}{{ 5 is divisibleby 5 }}{{ [1] is iterable }}{{ none is defined }}", {}),
    ("{% set x %}{% for i in range(3) %}{{ i }}{% endfor %}{% endset %}{{ x | length }}{{ x * 2 }}", {}),
    ("{% for i in range(3) %}{% set ns_local = i %}{% endfor %}{{ ns_local is defined }}", {}),
    ("{% macro m(x) %}{{ x }}{% if caller is defined %}{{ caller() }}{% endif %}{% endmacro %}{{ m(1) }}{% call m(2) %}c{% endcall %}", {}),
    ("{% macro m(a, b) %}{{ a }}|{{ b }}|{{ b is defined }}{% endmacro %}{{ m(1) }}", {}),
    ("{% for a, b in [(1, 'x'), (2, 'y')] %}{{ a }}{{ b }}{% endfor %}{% for (a, b) in [[3, 4]] %}{{ a + b }}{% endfor %}", {}),
    ("{% for x in [1, 2, 3] %}{{ loop.changed(x) if false }}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}", {}),
    ("{{ namespace(a=1, b=[2]) }}|{{ dict(x=1) }}|{{ dict({'y': 2}, z=3) }}", {}),
    ("{{ 'abc'.upper().lower().startswith('a') }}{{ ' x '.strip().center(5) }}|{{ 'a b'.replace(' ', '') }}", {}),
    ("{{ 1 if none is none }}{{ 2 if none }}|{{ [] or 'empty' }}|{{ 0 and 1 }}|{{ 1 and 0.0 }}", {}),
    ("{{ 1.0 == 1 }}{{ 0.1 * 3 }}{{ 1e-7 }}{{ 123456789.123 }}{{ 1.5e300 * 10 }}{{ -1e-5 }}{{ 100.0 }}{{ 2.5e15 }}{{ 1.0e16 }}", {}),
    ("{{ 10 / 4 }}{{ 9 / 3 }}{{ -9 // 4 }}{{ 9 % -4 }}{{ -9.5 % 4 }}{{ 2 ** 0.5 }}{{ 10 ** 15 }}", {}),
    # errors
    ("{{ [1] + 'a' }}", {}),
    ("{{ none + 1 }}", {}),
    ("{{ 'a' * 'b' }}", {}),
    ("{{ {}.x.y }}", {}),
    ("{{ [1, 2].append }}{{ [1, 2].append(3) }}", {}),
    ("{{ 'abc'.nosuchmethod() }}", {}),
    ("{{ 'a' < 1 }}", {}),
    ("{{ {'a': 1}['a']['b'].c }}", {}),
    ("{% set t = (1, 2) %}{{ t.count }}{{ t.append(3) }}", {}),
]

CASES += [
    ("{{ 'ab'.center(7, '*') }}|{{ 'ab'.ljust(5) }}|{{ 'ab'.rjust(5, '.') }}|{{ '-42'.zfill(6) }}|{{ 'abc'.center(2) }}|{{ 'x'.center(4) }}", {}),
    ("{{ 'stra\u00dfe'.upper() }}|{{ '\u00dfa'.capitalize() }}|{{ '\u00dfa b'.title() }}", {}),
]

CASES += [
    ("{{ obj | tojson(ensure_ascii=true) }}|{{ obj | tojson(ensure_ascii=false, indent='\t') }}", {"obj": {"k\u00e9": ["\u00e9\u65e5\U0001F642", 1]}}),
    ("{{ obj | tojson(indent=0) }}|{{ obj | tojson(indent=2, separators=(', ', ' = ')) }}", {"obj": {"a": [1, 2], "b": {}}}),
]

CASES += [
    ("{% for n in tree recursive %}<{{ n.name }}{{ loop.depth }}{% if n.kids %}[{{ loop(n.kids) }}]{% endif %}>{% endfor %}",
     {"tree": [{"name": "a", "kids": [{"name": "b", "kids": [{"name": "c"}]}, {"name": "d"}]}, {"name": "e"}]}),
    ("{% for x in [1, 1, 2, 3, 3] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}", {}),
    ("{% for x in [1] %}{{ loop([2]) }}{% endfor %}", {}),
]

CASES += [
    # generators (jinja2's select/map/items/... are lazy): always true, no len()
    ("{{ 'yes' if [] | select else 'no' }}{{ 'yes' if msgs | selectattr('role', 'equalto', 'x') else 'no' }}{{ not ([] | map('upper')) }}", {"msgs": [{"role": "user"}]}),
    ("{{ (msgs | selectattr('role')) is sequence }}{{ msgs | map(attribute='role') | first }}{{ {'a': 1}.items() }}{{ {'a': 1}.keys() }}{{ range(2, 9, 3) }}{{ range(3) }}", {"msgs": [{"role": "user"}]}),
    ("{{ [1, 2] | select | length }}", {}),
    ("{{ ([1, 2] | map('string'))[0] }}|{{ (1, 2) | reverse | list }}{{ u | reverse | list }}{{ [3, 4] | reverse | first }}", {}),
    ("{{ 2.5 is odd }}{{ 3.0 is odd }}{{ 4.0 is divisibleby 2 }}{{ '{}' is lower }}{{ 'a1' is lower }}{{ '1' is upper }}", {}),
    ("{{ false | select | list }}{{ 0 | map('upper') | list }}{% set g = 5 | items %}ok", {}),
    ("{{ 5 | items | list }}", {}),
]

CASES += [
    # jinja2's compile-time scoping (idtracking): a name stored unconditionally
    # later in a frame is missing (undefined) for the child frames read before
    ("{% macro m() %}[{{ s }}]{% endmacro %}{{ m() }}{% set s = 'new' %}{{ m() }}", {"s": "ctx"}),
    ("{{ s }}{% set s = 'new' %}{{ s }}", {"s": "ctx"}),
    ("{% for i in [1] %}[{{ s }}]{% endfor %}{% set s = 'new' %}", {"s": "ctx"}),
    ("{% for i in [1] %}[{{ s }}]{% endfor %}{% if true %}{% set s = 'a' %}{% endif %}", {"s": "ctx"}),
    ("{% for i in [1] %}[{{ s }}]{% endfor %}{% if true %}{% set s = 'a' %}{% else %}{% set s = 'b' %}{% endif %}", {"s": "ctx"}),
    ("{% for i in [1, 2] %}{% for j in [1] %}[{{ s }}]{% endfor %}{% set s = 'in' %}{% endfor %}", {"s": "ctx"}),
    ("{% for i in [1, 2] %}{% for j in [1] %}[{{ s }}]{% endfor %}{% set s = 'in' %}{% endfor %}[{{ s }}]", {"s": "ctx"}),
    ("{% macro m() %}[{{ s }}]{% endmacro %}{% for i in [1] %}{{ m() }}{% set s = 'L' %}{{ m() }}{% endfor %}", {"s": "ctx"}),
    ("{% macro m(a) %}{% for i in [1] %}[{{ z }}]{% endfor %}{% set z = a %}{% endmacro %}{{ m(3) }}", {"z": "ctxz"}),
    ("{% for i in [1] %}{% macro m() %}[{{ s }}]{% endmacro %}{{ m() }}{% set s = 2 %}{{ m() }}{% endfor %}", {"s": "ctx"}),
    ("{% filter upper %}{% set y = 1 %}{% endfilter %}[{{ y }}]{% set b %}{% set y2 = 1 %}{% endset %}[{{ y2 }}]{% with %}{% set w = 1 %}{% endwith %}[{{ w }}]", {}),
    ("{% set ns = namespace(v=1) %}{% for i in [1] %}{{ ns.v }}{% endfor %}{% set ns = namespace(v=2) %}{{ ns.v }}", {}),
]

CASES += [
    ("{{ big }}|{{ big | tojson }}|{{ {'id': big} | tojson }}|{{ big is integer }}|{{ big > 1 }}|{{ [big] }}|{{ big | string }}", {"big": 123456789012345678901234567890}),
]


PARSE_ERRORS = [
    "{% if true %}unclosed",
    "{% for x in y %}{% endif %}",
    "{% frobnicate %}",
    "{{ 1 + }}",
    "{{ x | nosuchfilter }}",
    "{{ x is nosuchtest }}",
    "{{ 'unterminated }}",
    "{% endfor %}",
    "{{ (1 }}",
    "{% break %}",
    "line1\nline2 {{ ) }}",
    "{# never closed",
]

NOW = 1785067200  # 2026-07-26 12:00:00 UTC


def make_env():
    from datetime import datetime, timezone
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        from jinja2.exceptions import TemplateError
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(NOW, tz=timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, src, variables):
    """variables: top-level names, or (with "messages") a whole chat request
    rendered as transformers renders it."""
    try:
        t = env.from_string(src)
    except Exception as e:  # parse error
        msg = str(e).split("\n")[0]
        # Python's compiler reports its own location for 'break' outside loop
        msg = msg.split(" (<template>")[0]
        return ("parse", msg)
    try:
        if "messages" in variables:
            r = variables
            return ("text", t.render(messages=r["messages"], tools=r.get("tools"), documents=r.get("documents"),
                                     add_generation_prompt=r.get("add_generation_prompt", False),
                                     **r.get("chat_template_kwargs", {})))
        return ("text", t.render(messages=[], tools=None, documents=None, add_generation_prompt=False, **variables))
    except Exception as e:
        return ("error", str(e))


def c_str(s):
    out = []
    for b in s.encode("utf-8"):
        c = chr(b)
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif c == "?":
            out.append("\\?")
        elif 0x20 <= b < 0x7F:
            out.append(c)
        else:
            out.append("\\%03o" % b)
    return '"' + "".join(out) + '"'


def generate():
    env = make_env()
    lines = ["/* Generated by tests/chat/jinja_diff.py --write from jinja2 %s in transformers'" % __import__("jinja2").__version__,
             " * environment. Do not edit: change the cases there and regenerate. */",
             "typedef struct jinja_case { const char *tmpl, *vars, *kind, *want; } jinja_case;",
             "static const jinja_case JINJA_CASES[] = {"]
    for src, variables in CASES:
        kind, want = render(env, src, variables)
        if kind == "parse":
            raise SystemExit("case does not parse in jinja2: %r: %s" % (src, want))
        lines.append("    {%s,\n     %s,\n     \"%s\", %s}," % (c_str(src), c_str(json.dumps(variables, ensure_ascii=False)), kind, c_str(want)))
    lines.append("};")
    lines.append("static const jinja_case JINJA_PARSE_ERRORS[] = {")
    for src in PARSE_ERRORS:
        kind, want = render(env, src, {})
        if kind != "parse":
            raise SystemExit("expected a parse error from jinja2: %r" % src)
        lines.append("    {%s, \"{}\", \"parse\", %s}," % (c_str(src), c_str(want)))
    lines.append("};")
    return "\n".join(lines) + "\n"


def main():
    try:
        import jinja2  # noqa: F401
    except ImportError:
        print("SKIP: jinja2 not installed (apt-get install python3-jinja2)")
        return 77
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "jinja_cases.h")
    text = generate()
    if "--write" in sys.argv:
        with open(path, "w") as f:
            f.write(text)
        print("wrote", path)
        return 0
    with open(path) as f:
        # the first line names the jinja2 version that wrote the table
        if f.read().split("\n", 1)[1] != text.split("\n", 1)[1]:
            print("tests/chat/jinja_cases.h is stale or differs from jinja2: run jinja_diff.py --write")
            return 1
    print("jinja_cases.h matches jinja2 on %d cases" % (len(CASES) + len(PARSE_ERRORS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
