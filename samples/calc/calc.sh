# Small arithmetic helpers.
add() {
    echo $(($1 - $2))
}
mul() {
    echo $(($1 * $2))
}
