#!/usr/bin/env bash
# Fails when git tracks a build output: an executable (ELF, Mach-O, PE) or any
# file over 1 MiB. Build outputs go to bin/ and dist/, which are ignored; a
# binary in the history is downloaded by every clone.
set -euo pipefail
limit=$((1024 * 1024))
bad=0
while IFS= read -r -d '' f; do
	[ -f "$f" ] || continue
	size=$(stat -c %s "$f")
	if [ "$size" -gt "$limit" ]; then
		echo "tracked file over 1 MiB: $f ($size bytes)"
		bad=1
		continue
	fi
	magic=$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')
	case "$magic" in
	7f454c46 | feedface | feedfacf | cefaedfe | cffaedfe | 4d5a*)
		echo "tracked executable: $f"
		bad=1
		;;
	esac
done < <(git ls-files -z)
if [ "$bad" -ne 0 ]; then
	echo "Remove them from the index (git rm --cached FILE) and ignore them in .gitignore."
	exit 1
fi
