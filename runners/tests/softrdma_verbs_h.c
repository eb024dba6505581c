/* Built by runners/tests/softrdma.rs against the installed verbs.h and linked to the software
 * device: the inline ibv_post_send, ibv_post_recv and ibv_poll_cq, ibv_query_port and
 * ibv_reg_mr as verbs.h defines them, on the device's objects. Prints "ok" or the failed check. */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#define CHECK(c) do { if (!(c)) { printf("FAIL line %d: %s\n", __LINE__, #c); return 1; } } while (0)
static int up(struct ibv_qp *q, struct ibv_qp *peer, union ibv_gid *gid) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT; a.port_num = 1; a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return 1;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR; a.path_mtu = IBV_MTU_1024; a.dest_qp_num = peer->qp_num; a.rq_psn = 1;
  a.max_dest_rd_atomic = 1; a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1; a.ah_attr.grh.dgid = *gid; a.ah_attr.grh.sgid_index = 1; a.ah_attr.grh.hop_limit = 64; a.ah_attr.port_num = 1;
  if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) return 2;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS; a.sq_psn = 1; a.timeout = 14; a.retry_cnt = 7; a.rnr_retry = 7; a.max_rd_atomic = 1;
  if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)) return 3;
  return 0;
}
int main(void) {
  int n = 0;
  struct ibv_device **l = ibv_get_device_list(&n);
  /* the two rule sets first, then one device per interface (rdma_<ifname>) */
  CHECK(l && n >= 2);
  CHECK(strcmp(ibv_get_device_name(l[1]), "softrdma_linux0") == 0);
  struct ibv_context *ctx = ibv_open_device(l[1]);
  ibv_free_device_list(l);
  CHECK(ctx);
  struct ibv_port_attr pa;
  CHECK(ibv_query_port(ctx, 1, &pa) == 0);
  CHECK(pa.state == IBV_PORT_ACTIVE && pa.active_mtu == IBV_MTU_4096 && pa.link_layer == IBV_LINK_LAYER_ETHERNET);
  union ibv_gid gid;
  CHECK(ibv_query_gid(ctx, 1, 1, &gid) == 0);
  CHECK(gid.raw[10] == 0xff && gid.raw[11] == 0xff);
  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
  CHECK(pd && cq && cq->context == ctx);
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = cq; ia.recv_cq = cq; ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 16; ia.cap.max_recv_wr = 16; ia.cap.max_send_sge = 1; ia.cap.max_recv_sge = 1;
  struct ibv_qp *a = ibv_create_qp(pd, &ia), *b = ibv_create_qp(pd, &ia);
  CHECK(a && b && a->context == ctx && a->qp_num != b->qp_num && a->state == IBV_QPS_RESET);
  CHECK(up(a, b, &gid) == 0 && up(b, a, &gid) == 0);
  CHECK(a->state == IBV_QPS_RTS);
  static char buf[8192];
  struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  CHECK(mr && mr->addr == buf && mr->length == sizeof buf);
  strcpy(buf, "hello over the software device");
  struct ibv_sge rs = { (uintptr_t)(buf + 4096), 4096, mr->lkey }, ss = { (uintptr_t)buf, 31, mr->lkey };
  struct ibv_recv_wr rw = { .wr_id = 7, .sg_list = &rs, .num_sge = 1 }, *bad_r;
  struct ibv_send_wr sw = { .wr_id = 8, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad_s;
  CHECK(ibv_post_recv(b, &rw, &bad_r) == 0);
  CHECK(ibv_post_send(a, &sw, &bad_s) == 0);
  struct ibv_wc wc[4];
  int got = 0, seen_recv = 0;
  for (int i = 0; i < 5000 && got < 2; i++) {
    int k = ibv_poll_cq(cq, 4, wc + got);
    CHECK(k >= 0);
    got += k;
    if (got < 2) usleep(1000);
  }
  CHECK(got == 2);
  for (int i = 0; i < 2; i++) {
    CHECK(wc[i].status == IBV_WC_SUCCESS);
    if (wc[i].wr_id == 7) { seen_recv = 1; CHECK(wc[i].opcode == IBV_WC_RECV && wc[i].byte_len == 31 && wc[i].qp_num == b->qp_num); }
  }
  CHECK(seen_recv && strcmp(buf + 4096, "hello over the software device") == 0);
  CHECK(strcmp(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error") == 0);
  CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0 && ibv_dereg_mr(mr) == 0);
  CHECK(ibv_destroy_cq(cq) == 0 && ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0);
  printf("ok\n");
  return 0;
}
