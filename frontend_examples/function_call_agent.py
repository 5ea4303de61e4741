"""One step of a function-calling agent over SGLang's OpenAI-compatible API, with ``tools``.

    python frontend_examples/function_call_agent.py --url http://127.0.0.1:30000

The model is offered two tools and must call one (``tool_choice="required"``: SGLang constrains the
output with a JSON schema built from the tool definitions). The call is executed locally, its result
is sent back as a ``tool`` message, and the model writes the final answer. Prints the tool call and
the answer as JSON.
"""

from __future__ import annotations

import argparse
import json

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convert an amount of money between currencies.",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number"},
                    "from_currency": {"type": "string"},
                    "to_currency": {"type": "string"},
                },
                "required": ["amount", "from_currency", "to_currency"],
            },
        },
    },
]


def get_weather(city: str, unit: str = "celsius") -> dict:
    """A local tool: a fixed report, so the example runs offline."""
    return {"city": city, "temperature": 18 if unit == "celsius" else 64, "unit": unit, "sky": "cloudy"}


def convert_currency(amount: float, from_currency: str, to_currency: str) -> dict:
    """A local tool with a fixed rate table, so the example runs offline."""
    usd_per_unit = {"USD": 1.0, "EUR": 1.08, "GBP": 1.27, "JPY": 0.0067}
    rate = usd_per_unit[from_currency.upper()] / usd_per_unit[to_currency.upper()]
    return {"amount": round(amount * rate, 2), "currency": to_currency.upper()}


SYSTEM = (
    "You are a helpful assistant. When a tool result arrives, answer the user's question in one plain "
    "English sentence using it."
)

LOCAL_TOOLS = {"get_weather": get_weather, "convert_currency": convert_currency}


def run_step(client: OpenAI, question: str, max_tokens: int = 256) -> dict:
    """Ask, execute the tool call the model makes, and return the call and the final answer."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    first = client.chat.completions.create(
        model="default", messages=messages, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=max_tokens
    )
    call = first.choices[0].message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    result = LOCAL_TOOLS[call.function.name](**arguments)
    messages += [
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
    ]
    final = client.chat.completions.create(
        model="default", messages=messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=max_tokens
    )
    return {
        "tool": call.function.name,
        "arguments": arguments,
        "tool_result": result,
        "answer": final.choices[0].message.content,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="server address")
    parser.add_argument("--question", default="What's the weather like in Lisbon right now, in celsius?")
    args = parser.parse_args()
    client = OpenAI(base_url=f"{args.url.rstrip('/')}/v1", api_key="EMPTY")
    print(json.dumps(run_step(client, args.question)))


if __name__ == "__main__":
    main()
