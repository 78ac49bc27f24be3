#!/usr/bin/env bash
# Lint the release workflow (CI): zizmor, a GitHub Actions linter from PyPI (syntax, expressions,
# permissions, injection; offline, with .github/zizmor.yml), and check-jsonschema against the
# GitHub workflow schema. Tools go to a virtual environment in build/release-lint.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tools=build/release-lint
python3 -m venv "$tools"
"$tools/bin/python" -m pip install -q --disable-pip-version-check "zizmor>=1.10" "check-jsonschema>=0.33"
for workflow in .github/workflows/*.yml; do
  echo "==> $workflow"
  "$tools/bin/zizmor" --offline --config .github/zizmor.yml "$workflow"
  "$tools/bin/check-jsonschema" --builtin-schema vendor.github-workflows "$workflow"
done
