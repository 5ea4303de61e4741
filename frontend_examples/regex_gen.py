"""SGLang frontend program: constrained generation with ``gen(regex=...)`` against a running server.

    python frontend_examples/regex_gen.py --url http://127.0.0.1:30000

The model reads a short note and fills a record whose fields are each constrained by a regular
expression (an ISO date, a version string, a yes/no flag), so every answer parses by construction.
"""

from __future__ import annotations

import argparse
import json

import sglang as sgl

DATE = r"\d{4}-\d{2}-\d{2}"
VERSION = r"\d{1,3}\.\d{1,3}\.\d{1,3}"
YES_NO = r"(yes|no)"


@sgl.function
def extract_release(s, note: str):
    s += sgl.system("You extract facts from release notes. Answer with the value only.")
    s += sgl.user(f"Release note: {note}\nOn which date was it released (YYYY-MM-DD)?")
    s += sgl.assistant(sgl.gen("date", max_tokens=16, regex=DATE))
    s += sgl.user("Which version number was released?")
    s += sgl.assistant(sgl.gen("version", max_tokens=16, regex=VERSION))
    s += sgl.user("Does the release fix a security problem? Answer yes or no.")
    s += sgl.assistant(sgl.gen("security_fix", max_tokens=4, regex=YES_NO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="server address")
    parser.add_argument(
        "--note",
        default="Version 2.4.1 of the parser shipped on 2025-03-14. It patches a buffer overflow "
        "(CVE-2025-1234) and speeds up startup.",
        help="release note to read",
    )
    args = parser.parse_args()
    sgl.set_default_backend(sgl.RuntimeEndpoint(args.url))
    state = extract_release.run(note=args.note, temperature=0)
    print(json.dumps({key: state[key] for key in ("date", "version", "security_fix")}))


if __name__ == "__main__":
    main()
