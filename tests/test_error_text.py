"""Client error messages without the server's file paths and line numbers (issue 51, problem 5)."""

from __future__ import annotations

from sglang_pask.api.error_text import validation_message, without_source_locations


def test_a_body_that_is_not_json_names_where_it_broke():
    errors = [
        {"type": "json_invalid", "loc": ("body", 14), "msg": "JSON decode error", "input": {}, "ctx": {"error": "x"}}
    ]
    assert validation_message(errors) == "request body is not valid JSON at character 14: x"


def test_fields_are_named_by_their_path_and_every_problem_is_listed():
    errors = [
        {"type": "int_parsing", "loc": ("body", "sampling_params", "max_new_tokens"), "msg": "Input should be an int"},
        {"type": "missing", "loc": ("body", "messages"), "msg": "Field required"},
    ]
    assert validation_message(errors) == (
        "sampling_params.max_new_tokens: Input should be an int; messages: Field required"
    )
    assert validation_message([]) == "invalid request body"


def test_source_locations_are_removed_and_the_message_kept():
    xgrammar = "[06:23:49] /project/cpp/regex_converter.cc:83: Regex parsing error at position 2: not closed.\n"
    assert without_source_locations(xgrammar) == "Regex parsing error at position 2: not closed."
    python = 'bad body\n\n  File "/x/http_server.py", line 928, in generate_request\n    POST /generate'
    assert without_source_locations(python) == "bad body\n    POST /generate"
