/*
 * update_time.c: how long a trainer's weight update takes on a running
 * worker, driven through the worker's control mailbox (the commands
 * nginx's /inference/v1/pause, /update_weights_from_disk and /resume
 * post): pause, update from a checkpoint directory, resume, repeated.
 * Each phase is timed from the post to the worker's answer; the worker's
 * own figures for the update (from the command to the swap, and the
 * part between two steps) are read from its control page.  Every answer
 * is checked: a failed command, or a version other than the one asked
 * for afterwards, fails the run.  --no-pause posts the update alone, as a
 * trainer does while generation goes on (mode keep: the requests in
 * flight continue on the new weights; the pause it causes is the time
 * between two steps).
 *
 *   update_time --shm NAME --model-path DIR [--repeat N] [--mode M]
 *               [--no-pause]
 *
 * One line per round, then the medians.
 */

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "msv_cmd.h"
#include "msv_link.h"
#include "msv_shm.h"


static double
now_s(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}


static int
cmp_double(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}


static double
median(double *v, int n)
{
    qsort(v, (size_t) n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}


/* Post one command and wait for its answer (at most timeout_s).  0 with
 * *secs, or -1 with a line on stderr. */
static int
command(struct msv_attachment *a, uint32_t op, uint32_t arg,
    const char *path, const char *version, double timeout_s, double *secs,
    struct msv_cmd *res)
{
    double  t0;
    int     r;

    t0 = now_s();
    while (msv_cmd_claim(a->rg.ctrl, a->pid) != 0) {
        if (now_s() - t0 > timeout_s) {
            fprintf(stderr, "update_time: the mailbox stays busy\n");
            return -1;
        }
        usleep(1000);
    }

    t0 = now_s();
    msv_cmd_post(a->rg.ctrl, a->pid, op, arg, path, version);
    msv_kick(a->kick_fd);

    for ( ;; ) {
        r = msv_cmd_poll(a->rg.ctrl, a->pid, res);
        if (r == 1) {
            break;
        }
        if (r < 0 || msv_attachment_check(a) != 0) {
            fprintf(stderr, "update_time: the worker went away: %s\n",
                    a->lost);
            return -1;
        }
        if (now_s() - t0 > timeout_s) {
            msv_cmd_abandon(a->rg.ctrl, a->pid);
            fprintf(stderr, "update_time: no answer in %.0f s\n", timeout_s);
            return -1;
        }
        msv_reader_heartbeat(a);
        usleep(200);
    }
    *secs = now_s() - t0;

    if (res->status != 0) {
        fprintf(stderr, "update_time: command %u failed (%d): %s\n", op,
                res->status, res->msg);
        return -1;
    }
    return 0;
}


int
main(int argc, char **argv)
{
    static struct option  opts[] = {
        { "shm",        required_argument, 0, 's' },
        { "model-path", required_argument, 0, 'm' },
        { "repeat",     required_argument, 0, 'r' },
        { "mode",       required_argument, 0, 'o' },
        { "no-pause",   no_argument,       0, 'n' },
        { 0, 0, 0, 0 }
    };
    static const char    *modes[] = { "abort", "wait", "keep" };

    struct msv_attachment  a;
    struct msv_cmd         res;
    const char            *shm, *path;
    char                   err[256], version[MSV_VERSION_MAX + 1];
    double                 tp[64], tu[64], tr[64], wu[64], wp[64];
    int                    c, repeat, mode, i, rc, pause;

    shm = NULL;
    path = NULL;
    repeat = 3;
    mode = 0;
    pause = 1;

    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's': shm = optarg; break;
        case 'm': path = optarg; break;
        case 'r': repeat = atoi(optarg); break;
        case 'n': pause = 0; break;
        case 'o':
            for (mode = 0; mode < 3 && strcmp(optarg, modes[mode]) != 0;
                 mode++) { }
            if (mode == 3) {
                fprintf(stderr, "update_time: --mode %s: expected abort, "
                        "wait or keep\n", optarg);
                return 2;
            }
            break;
        default:
            return 2;
        }
    }
    if (shm == NULL || path == NULL || repeat < 1 || repeat > 64
        || strlen(path) >= MSV_CMD_PATH_MAX)
    {
        fprintf(stderr, "usage: update_time --shm NAME --model-path DIR "
                "[--repeat 1..64] [--mode abort|wait|keep] [--no-pause]\n");
        return 2;
    }

    if (msv_attach(&a, shm, err, sizeof(err)) != 0) {
        fprintf(stderr, "update_time: %s\n", err);
        return 1;
    }

    rc = 0;
    printf("%-6s %10s %10s %10s %14s %14s\n", "round", "pause_s",
           "update_s", "resume_s", "worker_upd_s", "between_s");
    for (i = 0; i < repeat; i++) {
        snprintf(version, sizeof(version), "bench-%d", i + 1);
        tp[i] = 0.0;
        tr[i] = 0.0;
        if ((pause && command(&a, MSV_OP_PAUSE, (uint32_t) mode, NULL, NULL,
                              60, &tp[i], &res) != 0)
            || command(&a, MSV_OP_UPDATE, (uint32_t) mode, path, version,
                       300, &tu[i], &res) != 0)
        {
            rc = 1;
            break;
        }
        wu[i] = (double) atomic_load(&a.rg.ctrl->weight_update_ms) / 1e3;
        wp[i] = (double) atomic_load(&a.rg.ctrl->weight_pause_ms) / 1e3;
        if (strcmp(a.rg.ctrl->weight_version, version) != 0) {
            fprintf(stderr, "update_time: version \"%s\" after updating "
                    "to \"%s\"\n", a.rg.ctrl->weight_version, version);
            rc = 1;
            break;
        }
        if (pause
            && command(&a, MSV_OP_RESUME, 0, NULL, NULL, 60, &tr[i], &res)
               != 0)
        {
            rc = 1;
            break;
        }
        printf("%-6d %10.3f %10.3f %10.3f %14.3f %14.3f\n", i + 1, tp[i],
               tu[i], tr[i], wu[i], wp[i]);
    }

    if (rc == 0) {
        printf("\nmedians over %d rounds (mode %s%s, %s)\n", repeat,
               modes[mode], pause ? "" : ", no pause", path);
        printf("| phase | seconds |\n|---|---|\n");
        printf("| pause | %.3f |\n", median(tp, repeat));
        printf("| update_weights_from_disk | %.3f |\n", median(tu, repeat));
        printf("| resume | %.3f |\n", median(tr, repeat));
        printf("| the worker's update (command to swap) | %.3f |\n",
               median(wu, repeat));
        printf("| of which between two steps | %.3f |\n",
               median(wp, repeat));
    }

    msv_detach(&a);
    return rc;
}
