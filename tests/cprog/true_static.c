/* true_static: the smallest rank there is, linked statically (no
 * dynamic loader): exits 0. The fork+exec floor's program (forkfloor). */
int main(void) { return 0; }
