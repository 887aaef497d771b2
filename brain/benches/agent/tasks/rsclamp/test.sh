set -e
out="${TMPDIR:-/tmp}/clamp-tests-$$"
rustc --edition 2021 --test src/lib.rs -o "$out"
"$out"
