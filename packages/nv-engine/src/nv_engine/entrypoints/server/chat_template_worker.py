"""Render one chat template in this process (run by ChatTemplateSandbox): JSON job on stdin, JSON
{"text": ...} or {"error": ...} on stdout. Only jinja2 is imported; memory is capped first.

The environment matches what transformers gives chat templates (immutable sandbox, trim_blocks,
lstrip_blocks, loop controls, `tojson`, `raise_exception`, `strftime_now`)."""
import json
import resource
import sys
from datetime import datetime


def _cap_memory(limit: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or hard > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit if hard == resource.RLIM_INFINITY else hard))


def _render(job: dict) -> str:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    template = env.from_string(job["template"])
    messages = job["messages"]
    variables = {**job["special_tokens"], **job["kwargs"]}
    text = template.render(messages=messages, add_generation_prompt=job["add_generation_prompt"], **variables)
    if job["continue_final_message"] and messages:
        final = messages[-1].get("content")
        if isinstance(final, str) and final.strip():
            end = text.rfind(final.strip())
            if end < 0:
                raise ValueError("continue_final_message is set but the template drops the final message")
            text = text[:end + len(final.strip())]
    return text


def main() -> None:
    job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    _cap_memory(int(job["memory_bytes"]))
    try:
        text = _render(job)
        if len(text) > int(job["max_output_chars"]):
            raise ValueError(f"it rendered more than {job['max_output_chars']} characters")
        result = {"text": text}
    except MemoryError:
        result = {"error": "it needs more memory than the server allows"}
    except Exception as exc:   # the template's own error: reported to the client
        result = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(result))


if __name__ == "__main__":
    main()
