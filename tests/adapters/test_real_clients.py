"""Real client libraries against the daemon over HTTP (issue 23), unmodified.

openai-agents' Runner (Responses and chat-completions models, plain and
streamed) running a function tool to completion; LangChain's
`ChatOpenAI.with_structured_output` in each of its methods; the official SDK's
Responses call with the fields Codex and the Agents SDK send. The `scripted`
and `structured` entries (conftest.py) stand in for a model that calls tools
and writes JSON, so the answers are exact; everything between the client and
the engine is the production path.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel

agents = pytest.importorskip("agents")
langchain_openai = pytest.importorskip("langchain_openai")

CALLS: list[str] = []


@agents.function_tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    CALLS.append(city)
    return f"18C in {city}"


@pytest.fixture(scope="module", autouse=True)
def no_tracing() -> None:
    agents.set_tracing_disabled(True)


def agent(live: Any, kind: str) -> Any:
    client = openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    model_type = (agents.OpenAIResponsesModel if kind == "responses"
                  else agents.OpenAIChatCompletionsModel)
    return agents.Agent(name="weather", instructions="Answer about the weather.",
                        tools=[get_weather], model=model_type(model="scripted",
                                                              openai_client=client))


@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_agents_runner_runs_a_tool_to_the_answer(live: Any, kind: str) -> None:
    CALLS.clear()
    result = asyncio.run(agents.Runner.run(agent(live, kind), "What is the weather in Paris?"))
    assert CALLS == ["Paris"]
    assert result.final_output == "The weather in Paris is 18C."


@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_agents_runner_streamed(live: Any, kind: str) -> None:
    CALLS.clear()

    async def run() -> tuple[Any, list[str]]:
        streamed = agents.Runner.run_streamed(agent(live, kind), "What is the weather in Paris?")
        kinds = [event.type async for event in streamed.stream_events()]
        return streamed, kinds

    streamed, kinds = asyncio.run(run())
    assert CALLS == ["Paris"] and "raw_response_event" in kinds
    assert streamed.final_output == "The weather in Paris is 18C."


class Weather(BaseModel):
    city: Literal["Paris", "Oslo"]


@pytest.mark.parametrize("method", ["function_calling", "json_mode", "json_schema"])
def test_langchain_structured_output(live: Any, method: str) -> None:
    llm = langchain_openai.ChatOpenAI(model="structured", base_url=live.url + "/v1",
                                      api_key="unused", max_retries=0, temperature=0)
    chain = llm.with_structured_output(Weather, method=method)
    out = chain.invoke("Which city is the capital of France? Answer in JSON.")
    assert out == Weather(city="Paris")


def test_sdk_responses_with_include_and_prompt_cache_key(live: Any) -> None:
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    response = client.responses.create(
        model="scripted", input="Hello", store=False, prompt_cache_key="session-1",
        include=["reasoning.encrypted_content"], safety_identifier="user-1",
        reasoning={"effort": "low", "summary": "auto"}, text={"verbosity": "low"})
    assert response.output_text == "Hello from the script."
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="scripted", input="Hello",
                                include=["message.output_text.logprobs"])
    assert err.value.body["param"] == "include[0]"
