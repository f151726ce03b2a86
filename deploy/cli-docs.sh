#!/usr/bin/env bash
# Generates mrctl's shell completions and man pages from the binary:
#   deploy/completions/mrctl.bash, _mrctl (zsh), mrctl.fish and deploy/man/*.1
# Usage: bash deploy/cli-docs.sh [path/to/mrctl]   (default: target/release/mrctl, else target/debug/mrctl)
# Install e.g.: cp deploy/completions/mrctl.bash /etc/bash_completion.d/mrctl;
#               cp deploy/man/*.1 /usr/local/share/man/man1/ && mandb
set -euo pipefail
cd "$(dirname "$0")/.."
mrctl="${1:-}"
if [ -z "$mrctl" ]; then
  for c in target/release/mrctl target/debug/mrctl; do
    [ -x "$c" ] && { mrctl="$c"; break; }
  done
fi
[ -n "$mrctl" ] || { echo "cli-docs: build mrctl first (cargo build)" >&2; exit 2; }
mkdir -p deploy/completions
"$mrctl" completions bash > deploy/completions/mrctl.bash
"$mrctl" completions zsh > deploy/completions/_mrctl
"$mrctl" completions fish > deploy/completions/mrctl.fish
"$mrctl" man deploy/man
echo "cli-docs: wrote deploy/completions/ and deploy/man/" >&2
