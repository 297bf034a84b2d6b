#!/usr/bin/env bash
# Who may include whom (docs/architecture.md, "Layers"): every quoted
# #include "meshplan/<Layer>/..." of a source or header under a layer's
# folders must name a layer that the table below allows, and only the
# planner's MLIR layers (dialect, pipeline) and the tools may include MLIR or
# LLVM headers. A lower layer that includes a higher one fails, naming the
# file, the line and the rule. ctest runs it as structure.layers.
#
#   check-layers.sh SOURCE_DIR
set -uo pipefail
root=$1
# layer | folders (relative to SOURCE_DIR) | meshplan/<X> it may include | MLIR
rules=(
  "core|lib/Core include/meshplan/Core|Core|no"
  "support|lib/Support include/meshplan/Support|Core Support|no"
  "frontend|lib/Frontend include/meshplan/Frontend|Core Support Frontend|no"
  "plan|lib/Plan include/meshplan/Plan|Core Support Plan|no"
  "checkpoint|lib/Checkpoint include/meshplan/Checkpoint|Core Support Plan Checkpoint|no"
  "dialect|lib/Dialect include/meshplan/Dialect|Core Dialect|yes"
  "pipeline|lib/Pipeline include/meshplan/Pipeline|Core Support Frontend Plan Dialect Pipeline|yes"
  "runtime|runtime|Core Support Plan Checkpoint Runtime runtime.h|no"
)
violations=0
files=0
meshplan_re='^[[:space:]]*#[[:space:]]*include[[:space:]]*"meshplan/([^/"]+)'
mlir_re='^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](mlir|llvm)/'
for rule in "${rules[@]}"; do
  IFS='|' read -r layer folders allowed mlir <<<"$rule"
  for folder in $folders; do
    [[ -d $root/$folder ]] || { echo "check-layers: $folder: no such folder" >&2; exit 2; }
    files=$((files + $(find "$root/$folder" -type f | wc -l)))
    # FILE:LINE:TEXT of every #include under the folder.
    while IFS= read -r hit; do
      file=${hit%%:*}
      rest=${hit#*:}
      line=${rest%%:*}
      text=${rest#*:}
      where="${file#"$root"/}:$line"
      if [[ $text =~ $meshplan_re ]] && [[ " $allowed " != *" ${BASH_REMATCH[1]} "* ]]; then
        echo "$where: the $layer layer includes meshplan/${BASH_REMATCH[1]} (it may include: $allowed)"
        violations=$((violations + 1))
      fi
      if [[ $mlir == no && $text =~ $mlir_re ]]; then
        echo "$where: the $layer layer includes an MLIR or LLVM header (only dialect, pipeline and the tools may)"
        violations=$((violations + 1))
      fi
    done < <(grep -rnE --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' \
      --include='*.c' --include='*.inc' '^[[:space:]]*#[[:space:]]*include' "$root/$folder")
  done
done
if ((violations)); then
  echo "check-layers: $violations include(s) against the layer rules ($files files under the layers' folders)" >&2
  exit 1
fi
echo "check-layers: $files files under the layers' folders, every include within its layer's rules"
