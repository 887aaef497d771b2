. ./calc.sh
fail=0
check() {
    if [ "$2" = "$3" ]; then echo "ok   $1 = $2"; else echo "FAIL $1 = $2, want $3"; fail=1; fi
}
check "add 2 3" "$(add 2 3)" 5
check "add 10 -4" "$(add 10 -4)" 6
check "mul 3 4" "$(mul 3 4)" 12
exit $fail
