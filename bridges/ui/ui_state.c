/* kb_ui: the state document of /ui/api/state, from the service layer, the runtime, the driver
 * and the metrics. Runs on a libmicrohttpd connection thread (blocking calls are fine there). */
#include "ui_int.h"

#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "phases.h"
#include "store.h"

#define CALL_MS   5000
#define MAX_PAGES 50 /* 5000 sandboxes per owner at most on one page view */

/* ---- the actor tree ----------------------------------------------------------------------- */

static json_t *s_tree(kb_ui_t *ui, const char *caller)
{
    json_t *tree =
        kb_api_visible_tree(ka_service_system(ui->o.svc), KRT_ADDR_NONE, ui->o.auth, caller);
    return tree ? tree : json_array();
}

/* Owners of the sandbox actors in the tree (an operator's view lists each one's sandboxes). */
static void s_owners(json_t *tree, json_t *owners)
{
    size_t i;
    json_t *node;
    json_array_foreach(tree, i, node)
    {
        const char *kind = json_string_value(json_object_get(node, "kind"));
        const char *c =
            json_string_value(json_object_get(json_object_get(node, "state"), "creator"));
        if (kind && strcmp(kind, "sandbox") == 0 && c && *c)
            json_object_set_new(owners, c, json_true());
        s_owners(json_object_get(node, "children"), owners);
    }
}

/* ---- sandboxes ---------------------------------------------------------------------------- */

static json_t *s_phases(const char *id)
{
    ka_phase_times_t t;
    if (ka_phase_get(id, &t))
        return json_object();
    json_t *o = json_object();
    for (int p = 0; p < KA_PHASE_N_; p++)
        if (t.seconds[p] >= 0)
            json_object_set_new(o, ka_phase_name((ka_phase_t)p), json_real(t.seconds[p]));
    if (t.create_seconds >= 0)
        json_object_set_new(o, "create_to_ready", json_real(t.create_seconds));
    return o;
}

static json_t *s_sandbox(kb_ui_t *ui, const ka_store_sandbox_t *r, bool operator_)
{
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:I,s:I}", "id", r->id, "name", r->name,
                          "template", r->template_name, "namespace", r->template_namespace,
                          "revision", r->revision, "node", r->node, "created_ms",
                          (json_int_t)r->created_ms, "expires_ms", (json_int_t)r->expires_ms);
    if (!o)
        return NULL;
    json_object_set_new(o, "state", json_string(ka_state_name(r->state) ?: "UNKNOWN"));
    json_object_set_new(o, "operation", json_string(ka_op_name(r->operation) ?: "UNKNOWN"));
    if (operator_)
        json_object_set_new(o, "owner", json_string(r->creator));
    if (r->failure_reason[0])
        json_object_set_new(
            o, "failure",
            json_pack("{s:s,s:s}", "reason", r->failure_reason, "message", r->failure_message));
    ka_sandbox_stats_t st;
    if (ui->o.driver && ka_driver_stats_id(ui->o.driver, r->id, &st) == 0)
        json_object_set_new(o, "usage",
                            json_pack("{s:I,s:I,s:I,s:I}", "cpu_ns", (json_int_t)st.cpu_ns,
                                      "memory_bytes", (json_int_t)st.mem_bytes, "memory_limit",
                                      (json_int_t)st.mem_limit, "pids", (json_int_t)st.pids));
    json_object_set_new(o, "phases", s_phases(r->id));
    return o;
}

/* Appends owner's live sandboxes to out, page by page. */
static void s_list_owner(kb_ui_t *ui, const char *owner, bool operator_, json_t *out)
{
    for (int page = 0; page < MAX_PAGES; page++) {
        ka_sbx_list_req_t q;
        memset(&q, 0, sizeof q);
        snprintf(q.caller, sizeof q.caller, "%s", owner);
        q.limit = 100;
        q.offset = page * 100;
        krt_reply_t r;
        int code = ka_svc_call_sync(ui->o.svc, KA_SBX_LIST, &q, sizeof q, CALL_MS, &r);
        const ka_sbx_list_t *l = r.body;
        bool ok = code == KA_OK && r.len >= sizeof *l &&
                  r.len >= sizeof *l + (size_t)l->count * sizeof l->items[0];
        for (uint32_t i = 0; ok && i < l->count; i++)
            if (!l->items[i].deleted_ms)
                json_array_append_new(out, s_sandbox(ui, &l->items[i], operator_));
        bool more = ok && l->more;
        krt_reply_free(&r);
        if (!more)
            return;
    }
}

static json_t *s_sandboxes(kb_ui_t *ui, const char *caller, bool operator_, json_t *tree)
{
    json_t *out = json_array();
    if (!operator_) {
        s_list_owner(ui, caller, false, out);
        return out;
    }
    json_t *owners = json_object();
    s_owners(tree, owners);
    const char *owner;
    json_t *v;
    json_object_foreach(owners, owner, v) s_list_owner(ui, owner, true, out);
    json_decref(owners);
    return out;
}

/* ---- templates, nodes, pools -------------------------------------------------------------- */

static json_t *s_template(const ka_store_template_t *t)
{
    json_t *status = json_loads(ka_store_template_status(t), 0, NULL);
    json_t *ready = NULL;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(status, "conditions"), i, c)
    {
        const char *type = json_string_value(json_object_get(c, "type"));
        if (type && strcmp(type, "Ready") == 0)
            ready =
                json_pack("{s:O?,s:O?,s:O?}", "status", json_object_get(c, "status"), "reason",
                          json_object_get(c, "reason"), "message", json_object_get(c, "message"));
    }
    json_decref(status);
    return json_pack("{s:s,s:s,s:I,s:I,s:s,s:s,s:o}", "namespace", t->namespace_, "name", t->name,
                     "generation", (json_int_t)t->generation, "observed_generation",
                     (json_int_t)t->observed_generation, "desired_revision", t->desired_revision,
                     "latest_revision", t->latest_revision, "ready",
                     ready ? ready : json_pack("{s:s}", "status", "Unknown"));
}

static json_t *s_templates(kb_ui_t *ui)
{
    json_t *out = json_array();
    ka_tpl_key_t k;
    memset(&k, 0, sizeof k);
    krt_reply_t r;
    int code = ka_svc_call_sync(ui->o.svc, KA_TPL_LIST, &k, sizeof k, CALL_MS, &r);
    const ka_tpl_reply_t *rep = r.body;
    if (code == KA_OK && r.len >= sizeof *rep) {
        size_t blen = r.len - offsetof(ka_tpl_reply_t, blob);
        for (const ka_store_template_t *t = ka_store_blob_next(&rep->blob, blen, NULL); t;
             t = ka_store_blob_next(&rep->blob, blen, t))
            if (!t->deleted)
                json_array_append_new(out, s_template(t));
    }
    krt_reply_free(&r);
    return out;
}

static uint64_t s_live(kb_ui_t *ui)
{
    krt_reply_t r;
    uint64_t n = 0;
    if (ka_svc_call_sync(ui->o.svc, KA_SBX_COUNT, NULL, 0, CALL_MS, &r) == KA_OK &&
        r.len == sizeof(ka_sbx_count_t))
        n = ((const ka_sbx_count_t *)r.body)->live;
    krt_reply_free(&r);
    return n;
}

static json_t *s_pools(kb_ui_t *ui, uint64_t live)
{
    json_t *out = json_array();
    for (size_t i = 0; i < ui->o.n_pools; i++) /* one pool class per node today */
        json_array_append_new(out, json_pack("{s:s,s:s,s:I,s:I}", "name", ui->o.pools[i].name,
                                             "class", ui->o.pools[i].klass, "capacity",
                                             (json_int_t)ui->o.pools[i].capacity, "in_use",
                                             (json_int_t)(i == 0 ? live : 0)));
    return out;
}

static json_t *s_nodes(kb_ui_t *ui, uint64_t live)
{
    json_t *pools = json_array();
    for (size_t i = 0; i < ui->o.n_pools; i++)
        json_array_append_new(pools, json_string(ui->o.pools[i].name));
    return json_pack("[{s:i,s:s,s:s,s:s,s:b,s:I,s:o}]", "id", ui->o.node_id, "name",
                     ui->o.node_name ?: "", "endpoint", ui->o.endpoint ?: "", "version",
                     ui->o.version ?: "", "alive", 1, "sandboxes", (json_int_t)live, "pools",
                     pools);
}

/* ---- stats -------------------------------------------------------------------------------- */

static json_t *s_hist(ka_metric_t m, const char *v1)
{
    ka_metric_snapshot_t s;
    ka_metric_snapshot(m, v1, &s);
    json_t *bounds = json_array(), *buckets = json_array();
    for (size_t i = 0; i < KA_METRIC_N_BOUNDS; i++) {
        json_array_append_new(bounds,
                              i + 1 < KA_METRIC_N_BOUNDS ? json_real(s.bounds[i]) : json_null());
        json_array_append_new(buckets, json_integer((json_int_t)s.buckets[i]));
    }
    return json_pack("{s:o,s:o,s:I,s:f}", "bounds", bounds, "buckets", buckets, "count",
                     (json_int_t)s.count, "sum", s.sum);
}

static json_t *s_stats(kb_ui_t *ui, uint64_t live)
{
    krt_stats_t st;
    krt_system_stats(ka_service_system(ui->o.svc), &st);
    return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o}", "now_ms", (json_int_t)krt_now_ms(),
                     "actors_live", (json_int_t)st.actors_live, "actors_spawned",
                     (json_int_t)st.actors_spawned, "messages", (json_int_t)st.messages,
                     "actor_bytes", (json_int_t)st.bytes_live, "sandboxes_live", (json_int_t)live,
                     "rss_bytes", (json_int_t)ka_metrics_rss_bytes(), "create_seconds",
                     s_hist(KA_METRIC_SANDBOX_CREATE, NULL), "exec_seconds",
                     s_hist(KA_METRIC_GUEST_CALL, "start"));
}

json_t *kb_ui_state(kb_ui_t *ui, const char *caller, bool operator_)
{
    uint64_t live = s_live(ui);
    json_t *tree = s_tree(ui, caller);
    json_t *sandboxes = s_sandboxes(ui, caller, operator_, tree);
    return json_pack("{s:s,s:b,s:o,s:o,s:o,s:o,s:o,s:o}", "identity", caller, "operator", operator_,
                     "tree", tree, "sandboxes", sandboxes, "templates", s_templates(ui), "nodes",
                     s_nodes(ui, live), "pools", s_pools(ui, live), "stats", s_stats(ui, live));
}
