/* Bandwidth probe for the ep test bed, built and run by `scripts/ep-testbed.sh selftest`. Three
 * patterns, each for a bounded time after one untimed warm-up, with the payload checked at the end:
 *   pingpong  rank 0 -> 1 -> 0, one direction at a time: the link's one-way rate
 *   exchange  ranks 0 and 1 MPI_Isend/MPI_Irecv to each other at once: both directions
 *   alltoall  MPI_Alltoall over all ranks (Open MPI's own algorithm choice) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char pattern(size_t i, int from, int to) {
  return (unsigned char)((i * 131u + (size_t)from * 7u + (size_t)to * 3u) & 0xffu);
}

/* Runs body() once untimed, then until `secs` have passed (at most maxit times); rank 0
 * decides and broadcasts whether to go on. Returns iterations; *elapsed as rank 0 saw it. */
static int timed(void (*body)(void *), void *arg, double secs, int maxit, double *elapsed) {
  int rank, go = 1, it = 0;
  double t0, t1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  body(arg);
  MPI_Barrier(MPI_COMM_WORLD);
  t0 = t1 = MPI_Wtime();
  for (;;) {
    if (rank == 0) go = it == 0 || (it < maxit && t1 - t0 < secs);
    MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!go) break;
    body(arg);
    ++it;
    t1 = MPI_Wtime();
  }
  *elapsed = t1 - t0;
  return it;
}

struct ctx { unsigned char *s, *r; size_t bytes; int rank, size; };

static void pingpong(void *p) {
  struct ctx *c = p;
  if (c->rank == 0) {
    MPI_Send(c->s + c->bytes, (int)c->bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
    MPI_Recv(c->r + c->bytes, (int)c->bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else if (c->rank == 1) {
    MPI_Recv(c->r, (int)c->bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Send(c->r, (int)c->bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
  }
}

static void exchange(void *p) {
  struct ctx *c = p;
  MPI_Request q[2];
  int peer = 1 - c->rank;
  if (c->rank > 1) return;
  MPI_Irecv(c->r + (size_t)peer * c->bytes, (int)c->bytes, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &q[0]);
  MPI_Isend(c->s + (size_t)peer * c->bytes, (int)c->bytes, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &q[1]);
  MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
}

static void alltoall(void *p) {
  struct ctx *c = p;
  MPI_Alltoall(c->s, (int)c->bytes, MPI_BYTE, c->r, (int)c->bytes, MPI_BYTE, MPI_COMM_WORLD);
}

/* Block j of r must hold what rank j sent to this rank (sampled). */
static int check_block(const struct ctx *c, int j) {
  size_t i;
  for (i = 0; i < c->bytes; i += 4093)
    if (c->r[(size_t)j * c->bytes + i] != pattern(i, j, c->rank)) return 1;
  return 0;
}

int main(int argc, char **argv) {
  struct ctx c;
  double secs, t_pp = 0.0, t_ex = 0.0, t_a2a = 0.0;
  int it_pp, it_ex, it_a2a, len, bad = 0, j;
  size_t i;
  char name[MPI_MAX_PROCESSOR_NAME], *names;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &c.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c.size);
  c.bytes = argc > 1 ? strtoul(argv[1], NULL, 10) : 4u << 20;
  secs = argc > 2 ? atof(argv[2]) : 1.0;
  if (c.size < 2) {
    fprintf(stderr, "bw: needs at least 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  memset(name, 0, sizeof name);
  MPI_Get_processor_name(name, &len);
  names = malloc((size_t)c.size * MPI_MAX_PROCESSOR_NAME);
  c.s = malloc(c.bytes * (size_t)c.size);
  c.r = malloc(c.bytes * (size_t)c.size);
  if (!c.s || !c.r || !names) MPI_Abort(MPI_COMM_WORLD, 3);
  MPI_Gather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0,
             MPI_COMM_WORLD);
  for (j = 0; j < c.size; ++j)
    for (i = 0; i < c.bytes; ++i) c.s[(size_t)j * c.bytes + i] = pattern(i, c.rank, j);

  it_pp = timed(pingpong, &c, secs, 10000, &t_pp);
  if (c.rank == 0 && memcmp(c.s + c.bytes, c.r + c.bytes, c.bytes) != 0) bad = 1; /* echoed back */
  it_ex = timed(exchange, &c, secs, 10000, &t_ex);
  if (c.rank <= 1 && check_block(&c, 1 - c.rank)) bad = 1;
  it_a2a = timed(alltoall, &c, secs, 10000, &t_a2a);
  for (j = 0; j < c.size; ++j) bad |= check_block(&c, j);
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);

  if (c.rank == 0) {
    double pp = 2.0 * (double)c.bytes * it_pp / t_pp * 8e-6;
    double ex = (double)c.bytes * it_ex / t_ex * 8e-6;
    double a2a = (double)c.bytes * (c.size - 1) * it_a2a / t_a2a * 8e-6;
    printf("ranks:");
    for (j = 0; j < c.size; ++j) printf(" %s", names + (size_t)j * MPI_MAX_PROCESSOR_NAME);
    printf("\n");
    printf("pingpong %zu B x %d round trips in %.3f s: %.1f Mbit/s one way\n", c.bytes, it_pp,
           t_pp, pp);
    printf("exchange %zu B both ways at once x %d in %.3f s: %.1f Mbit/s each way\n", c.bytes,
           it_ex, t_ex, ex);
    printf("alltoall %zu B per peer x %d in %.3f s: %.1f Mbit/s out of each rank\n", c.bytes,
           it_a2a, t_a2a, a2a);
    printf("RESULT pingpong_mbit=%.1f exchange_mbit=%.1f alltoall_mbit=%.1f data=%s\n", pp, ex,
           a2a, bad ? "BAD" : "ok");
  }
  free(c.s);
  free(c.r);
  free(names);
  MPI_Finalize();
  return bad;
}
