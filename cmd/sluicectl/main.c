#include <stdio.h>
int main(void) { puts("sluicectl"); return 0; }
