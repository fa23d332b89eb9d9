#!/usr/bin/env bash
# Checks every quoted #include of the folders in docs/layering.md's table against the folders that
# row allows (besides the folder itself and include/braid); prints each upward or unknown include
# as file:line and fails if there is any.
# Usage: check_layering.sh [repository root] (default: this script's repository)
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
table="$root/docs/layering.md"
[[ -f "$table" ]] || { echo "check_layering: no table at $table" >&2; exit 2; }

# folder -> allowed folders, and folder -> single files it may include besides, from the table's
# rows "| folder | folders ... | files ... |".
declare -A allowed files
while IFS='|' read -r _ folder deps extra _; do
  folder="$(echo "$folder" | xargs)"
  [[ -z "$folder" || "$folder" == folder || "$folder" == ---* ]] && continue
  allowed["$folder"]=" $folder include/braid $(echo "$deps" | xargs) "
  files["$folder"]=" $(echo "$extra" | xargs) "
done < <(grep -E '^\|' "$table")
(( ${#allowed[@]} > 0 )) || { echo "check_layering: the table in $table is empty" >&2; exit 2; }

# The folder an include path names: its first component, as the build's include roots lay it out.
folder_of_include() {
  case "$1" in
    braid/*) echo include/braid ;;
    core/* | coll/* | kernels/* | plan/* | dp/*) echo "src/${1%%/*}" ;;
    base/* | transport/* | topology/*) echo "${1%%/*}" ;;
    perf/*) echo tools/perf ;;
    */*) echo "unknown:${1%%/*}" ;;
    *) echo "" ;;  # a file beside the includer
  esac
}

# The table row a file belongs to: the longest folder that is a prefix of its path.
row_of_file() {
  local best="" folder
  for folder in "${!allowed[@]}"; do
    if [[ "$1" == "$folder"/* && ${#folder} -gt ${#best} ]]; then best="$folder"; fi
  done
  echo "$best"
}

violations=0 checked=0
cd "$root"
for folder in "${!allowed[@]}"; do
  [[ -d "$folder" ]] || { echo "check_layering: folder $folder of the table does not exist" >&2; exit 2; }
done
while IFS= read -r file; do
  row="$(row_of_file "$file")"
  [[ -n "$row" ]] || continue
  checked=$((checked + 1))
  while IFS=: read -r line include; do
    target="$(folder_of_include "$include")"
    [[ -z "$target" ]] && continue
    [[ "${files[$row]}" == *" $target/${include#*/} "* ]] && continue  # a file the row names
    if [[ "$target" == unknown:* || "${allowed[$row]}" != *" $target "* ]]; then
      echo "$file:$line: includes \"$include\" ($target), which $row may not (allowed: ${allowed[$row]})"
      violations=$((violations + 1))
    fi
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$file" |
           sed -E 's/^([0-9]+):[^"]*"([^"]+)".*/\1:\2/')
done < <(find "${!allowed[@]}" -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.cc' -o -name '*.c' -o -name '*.cu' -o -name '*.cuh' \) | sort -u)

echo "check_layering: $checked files in ${#allowed[@]} folders, $violations upward or unknown includes"
(( violations == 0 ))
