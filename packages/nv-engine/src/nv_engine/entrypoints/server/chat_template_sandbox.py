"""Renders a chat template that came with a request, where it cannot hurt the server: a separate
Python process (jinja2's immutable sandbox inside) with a memory cap, an output cap and a time limit;
past the limit the process is killed and the request gets a 400."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from nv_engine.entrypoints.server.errors import APIError
from nv_engine.entrypoints.server.limits import ServerLimits

_WORKER = Path(__file__).with_name("chat_template_worker.py")


class ChatTemplateSandbox:
    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits

    async def render(self, template: str, messages: list[dict], *, special_tokens: dict[str, str],
                     add_generation_prompt: bool, continue_final_message: bool, kwargs: dict[str, Any],
                     param: str) -> str:
        """The rendered text; APIError 400 (naming `param`) when the template fails, runs out of
        time or memory, or renders more than the prompt-size limit."""
        job = {"template": template, "messages": messages, "special_tokens": special_tokens,
               "add_generation_prompt": add_generation_prompt,
               "continue_final_message": continue_final_message, "kwargs": kwargs,
               "max_output_chars": self.limits.max_prompt_chars,
               "memory_bytes": self.limits.chat_template_memory_bytes}
        try:
            payload = json.dumps(job).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise APIError(f"chat_template_kwargs must be JSON values: {exc}", param=param) from exc
        # -I: isolated mode (no user site-packages, no current directory on sys.path)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", str(_WORKER), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(payload), self.limits.chat_template_timeout_s)
        except TimeoutError:
            raise APIError(f"The chat template in {param} did not render within "
                           f"{self.limits.chat_template_timeout_s:g} s.", param=param) from None
        finally:   # whatever happened (timeout, client gone), nothing keeps running
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        try:
            result = json.loads(out.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            result = {"error": "the renderer ran out of memory or crashed"}
        if "text" not in result:
            raise APIError(f"Could not apply the chat template in {param}: {result.get('error')}",
                           param=param)
        return str(result["text"])
