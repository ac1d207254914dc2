/* sluice — placeholder main while the daemon core is written. */
#include <stdio.h>
int main(void) { puts("sluice"); return 0; }
