"""What one chat request's tools, tool_choice and the server's parsing options mean for its output: the
JSON schema that forces the calls (tool_choice "required" or a named
function), and the parser each choice's output goes through. Request errors are 400s naming the field.

tool_choice "required" and a named function work with any chat template: the grammar forces the
output (the arguments object; or an array of {"name", "parameters"} items, as vLLM does) and a parser
that does not depend on the template reads it back. "auto" (the default when tools are sent) needs
`--enable-auto-tool-choice --tool-call-parser NAME`: the model writes calls in its template's format.
parallel_tool_calls=false: "required" forces exactly one call; "auto" keeps the first call the model wrote."""
from __future__ import annotations

import dataclasses
from typing import Any

from nv_engine.entrypoints.server.chat_output_parser import ChatOutputParser
from nv_engine.entrypoints.server.chat_parsing_options import ChatParsingOptions
from nv_engine.entrypoints.server.errors import APIError
from nv_engine.entrypoints.server.protocol import ChatCompletionRequest
from nv_engine.entrypoints.server.reasoning.registry import REASONING_PARSERS
from nv_engine.entrypoints.server.tool_parsers.first_call_tool_parser import FirstCallToolParser
from nv_engine.entrypoints.server.tool_parsers.named_function_tool_parser import NamedFunctionToolParser
from nv_engine.entrypoints.server.tool_parsers.registry import TOOL_PARSERS
from nv_engine.entrypoints.server.tool_parsers.required_tool_parser import RequiredToolParser
from nv_engine.entrypoints.server.tool_parsers.tool_parser import ToolParser
from nv_engine.entrypoints.server.tool_protocol import ChatTool, NamedToolChoice

_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


class ChatOutputPlan:
    def __init__(self, req: ChatCompletionRequest, options: ChatParsingOptions) -> None:
        self.options = options
        self.tools: list[ChatTool] = list(req.tools or ())
        choice = req.tool_choice
        if choice is None:
            choice = "auto" if self.tools else "none"
        if not self.tools and choice != "none":
            raise APIError("tool_choice needs `tools`: send the functions the model may call.",
                           param="tool_choice")
        if choice == "auto" and not options.enable_auto_tool_choice:
            raise APIError('tool_choice "auto" (the default when `tools` are sent) needs a server started '
                           "with --enable-auto-tool-choice and --tool-call-parser; send tool_choice "
                           '"required", "none" or a named function instead.', param="tool_choice")
        names = [tool.function.name for tool in self.tools]
        if len(set(names)) != len(names):
            raise APIError(f"tools has duplicate function names: {names}.", param="tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise APIError(f"tool_choice names the function {choice.function.name!r}, which is not in "
                           f"tools ({', '.join(names)}).", param="tool_choice")
        self.tool_choice: str | NamedToolChoice = choice
        self.one_call = req.parallel_tool_calls is False   # at most one call (a named function makes one)

    # ------------------------------------------------------------------------------- sampling
    @property
    def forced(self) -> bool:
        """The grammar writes the calls (tool_choice "required" or a named function)."""
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)

    def _parameters(self, tool: ChatTool) -> dict[str, Any]:
        return tool.function.parameters or dict(_EMPTY_PARAMETERS)

    @property
    def json_schema(self) -> dict[str, Any] | None:
        """The schema the output must fit, None when the calls are not forced."""
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function.name
            return self._parameters(next(t for t in self.tools if t.function.name == name))
        if self.tool_choice == "required":
            return RequiredToolParser.json_schema([(t.function.name, self._parameters(t)) for t in self.tools],
                                                  one_call=self.one_call)
        return None

    def constrain(self, params: Any) -> Any:
        """`params` (SamplingParams) with the forcing schema as its structured output, or as it is."""
        schema = self.json_schema
        if schema is None:
            return params
        try:
            from nv_engine.sampling_params import StructuredOutputsParams
        except ImportError as exc:
            raise APIError(f"tool_choice {self._choice_text()} needs structured outputs, which this "
                           f"build of nv lacks (nv_engine.sampling_params.StructuredOutputsParams).",
                           param="tool_choice", status=501) from exc
        if getattr(params, "structured_outputs", None) is not None:
            raise APIError(f"tool_choice {self._choice_text()} cannot be combined with another structured "
                           f"output (response_format, structured_outputs).", param="tool_choice")
        try:
            return dataclasses.replace(params, structured_outputs=StructuredOutputsParams(json=schema))
        except (ValueError, TypeError) as exc:   # a parameters schema the grammar cannot take
            raise APIError(f"The tools' parameters cannot be enforced: {exc}", param="tools") from exc

    def _choice_text(self) -> str:
        if isinstance(self.tool_choice, NamedToolChoice):
            return f"naming the function {self.tool_choice.function.name!r}"
        return f'"{self.tool_choice}"'

    # ------------------------------------------------------------------------------- the output
    def _tool_parser(self) -> ToolParser | None:
        if isinstance(self.tool_choice, NamedToolChoice):
            return NamedFunctionToolParser(self.tool_choice.function.name)
        if self.tool_choice == "required":
            return RequiredToolParser()
        if self.tool_choice == "auto" and self.options.tool_call_parser is not None:
            parser = TOOL_PARSERS[self.options.tool_call_parser]()
            return FirstCallToolParser(parser) if self.one_call else parser
        return None

    def output_parser(self, prompt_tail: str) -> ChatOutputParser:
        """A fresh parser for one choice. `prompt_tail`: the end of the rendered prompt (a template may
        open the reasoning block). Forced calls have no reasoning part: the grammar starts at once."""
        reasoning = None
        if self.options.reasoning_parser is not None and not self.forced:
            reasoning = REASONING_PARSERS[self.options.reasoning_parser](prompt_tail)
        return ChatOutputParser(reasoning_parser=reasoning, tool_parser=self._tool_parser())
