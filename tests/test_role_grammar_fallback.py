"""Role analysis never refuses a grammar that xgrammar accepted: it falls back to the lexer."""

from sglang_pask.srt import grammar as srt_grammar
from sglang_pask.structure import RoleGrammar


def _is_lexer(grammar: RoleGrammar) -> bool:
    return type(grammar.machine).__name__ == "LexerRoleMachine"


def test_unreadable_grammars_fall_back_to_the_lexer(vocab):
    assert _is_lexer(srt_grammar.role_grammar_for("json", "{not json", vocab))
    unsupported_tag = '{"type": "structural_tag", "format": {"type": "regex", "pattern": "a+"}}'
    assert _is_lexer(srt_grammar.role_grammar_for("structural_tag", unsupported_tag, vocab))
    assert _is_lexer(srt_grammar.role_grammar_for("unknown-kind", "", vocab))


def test_unexpected_analysis_errors_fall_back_too(vocab, monkeypatch):
    real_compile = RoleGrammar.compile.__func__

    def broken(cls, kind, key_string, vocab, **kwargs):
        if kind != "text":
            raise KeyError("bug")
        return real_compile(cls, kind, key_string, vocab, **kwargs)

    monkeypatch.setattr(RoleGrammar, "compile", classmethod(broken))
    assert _is_lexer(srt_grammar.role_grammar_for("json", '{"type": "object"}', vocab))


def test_readable_grammars_get_their_own_machine(vocab):
    assert not _is_lexer(srt_grammar.role_grammar_for("json", '{"type": "object"}', vocab))
    assert not _is_lexer(srt_grammar.role_grammar_for("regex", r"\[f\(a=1\)\]", vocab))
