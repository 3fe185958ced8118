#!/usr/bin/python3
"""The ten shipped templates of ../shared/chat_templates over richer requests
than the goldens (tools, tool calls and results, ipython, None content, an
empty conversation, thinking and date kwargs, builtin/custom tools, with and
without a generation prompt): our renders (jinja_render_tool) must equal
jinja2's, and our errors must contain jinja2's message. Runs in the unit
suite; exits 77 without jinja2 or the test data."""
import copy, glob, json, os, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from jinja_diff import make_env
    env = make_env()
except ImportError:
    print("SKIP: jinja2 not installed")
    sys.exit(77)
SHARED = os.environ.get("PAGEDGEN_SHARED", os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../shared"))
TOOL = os.path.join(os.environ.get("PAGEDGEN_BUILD_ROOT", "build"), "tests/chat/jinja_render_tool")
if not glob.glob(SHARED + "/chat_templates/templates/*.jinja"):
    print("SKIP: no templates under", SHARED)
    sys.exit(77)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City"}}, "required": ["city"]}}}]
convs = {
 "tools-call": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "abcdefghi", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "{\"t\": 21}", "tool_call_id": "abcdefghi"}, {"role": "assistant", "content": "21 C"}, {"role": "user", "content": "ok"}],
 "plain": [{"role": "user", "content": "  hi  "}, {"role": "assistant", "content": "\nyo\n"}, {"role": "user", "content": "é🙂"}],
 "system-think": [{"role": "system", "content": "Be short /no_think"}, {"role": "user", "content": "x"}],
 "none-content": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}],
 "ipython": [{"role": "user", "content": "run"}, {"role": "ipython", "content": {"out": [1, 2]}}],
 "empty": [],
}
kwsets = [{}, {"enable_thinking": False}, {"builtin_tools": ["code_interpreter", "brave_search"], "date_string": "01 Jan 2025"}, {"tools_in_user_message": False}, {"custom_tools": TOOLS}]
cases = []
for path in sorted(glob.glob(SHARED + "/chat_templates/templates/*.jinja")):
    src = open(path).read()
    for cname, msgs in convs.items():
        for tools in [None, TOOLS]:
            for kw in kwsets:
                for agp in [True, False]:
                    req = {"messages": msgs, "add_generation_prompt": agp, "chat_template_kwargs": dict(kw, bos_token="<s>", eos_token="</s>")}
                    if tools is not None:
                        req["tools"] = tools
                    cases.append((path, src, req))
inp = "".join(json.dumps({"template": s, "request": r}) + "\n" for _, s, r in cases)
out = subprocess.run([TOOL], input=inp.encode(), capture_output=True, check=True)
ours = [json.loads(x) for x in out.stdout.decode().splitlines()]
bad = 0
compiled = {}
for (path, src, req), o in zip(cases, ours):
    if path not in compiled:
        compiled[path] = env.from_string(src)
    t = compiled[path]
    r = copy.deepcopy(req)
    try:
        want = {"text": t.render(messages=r["messages"], tools=r.get("tools"), documents=None, add_generation_prompt=r["add_generation_prompt"], **r["chat_template_kwargs"])}
    except Exception as e:
        want = {"error": str(e)}
    same = (want.get("text") is not None and o.get("text") == want["text"]) or ("error" in want and "error" in o and want["error"] in o["error"])
    if not same:
        bad += 1
        if bad <= 8:
            print(path.split("/")[-1], json.dumps(req)[:300])
            print("  want:", repr(want)[:400])
            print("  ours:", repr(o)[:400])
print(len(cases), "cases,", bad, "differ")
sys.exit(1 if bad else 0)
