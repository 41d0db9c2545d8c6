#!/usr/bin/env bash
# hack/values-table.sh HELM_DOCS CHART DOC prints DOC with the part between
# its markers
#   <!-- values:begin ... -->
#   <!-- values:end -->
# replaced by the values table helm-docs generates from the `# --` comments
# of CHART/values.yaml (in the file's order). `make docs-values` writes it
# back; `make verify-docs` fails when DOC differs from it.
set -euo pipefail

if [[ $# -ne 3 ]]; then
	echo "usage: $0 HELM_DOCS CHART DOC" >&2
	exit 2
fi
helm_docs=$1
chart=$2
doc=$3

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '{{ template "chart.valuesTable" . }}\n' >"$tmp/values.gotmpl"
"$helm_docs" --chart-search-root "$(dirname "$chart")" --chart-to-generate "$chart" \
	--template-files "$tmp/values.gotmpl" --sort-values-order file --dry-run --log-level warning >"$tmp/table.md"
if ! grep -q '^| Key ' "$tmp/table.md"; then
	echo "helm-docs produced no values table for $chart" >&2
	exit 1
fi

grep -q '^<!-- values:begin' "$doc" && grep -q '^<!-- values:end' "$doc" || {
	echo "$doc has no <!-- values:begin --> and <!-- values:end --> markers" >&2
	exit 1
}
awk -v table="$tmp/table.md" '
	/^<!-- values:begin/ { print; while ((getline line < table) > 0) print line; skip = 1; next }
	/^<!-- values:end/ { skip = 0 }
	!skip { print }
' "$doc"
