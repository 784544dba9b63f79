// fusec: placeholder until the front end lands (replaced in the foundation work).
int main() { return 0; }
