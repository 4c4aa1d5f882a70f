/*
 * ka_snapobj: a sandbox's snapshot in object storage (s3://, gs://), made of
 *   <prefix><sandbox id>/<created ms>-<random>.tar.zst   the archive (ka_snapshot), and
 *   <prefix><sandbox id>/manifest.json                   the reference to it:
 *   {"format":"kagent-snapshot/1","sandbox":id,"revision":rev,"object":key,
 *    "archiveBytes":n,"sha256":hex,"files":n,"dirs":n,"symlinks":n,"bytes":n,"createdMs":ms}
 *
 * A save uploads a new archive under a new name, and only once that upload completed writes
 * the manifest that names it (one PUT: the switch is atomic); the archive the manifest named
 * before is deleted only after that. A crash in between leaves an extra archive, never a
 * manifest naming a missing or partial one. A restore reads the manifest, checks it names this
 * sandbox, streams the archive into the target and checks its size and sha256.
 *
 * Blocking (run on a job thread). Errors: negative errnos with a reason for people in err.
 */
#ifndef KA_SNAPOBJ_H
#define KA_SNAPOBJ_H

#include <stddef.h>

#include "ka_tree.h"

#define KA_SNAPOBJ_FORMAT "kagent-snapshot/1"

/* Archives dir as sandbox id's snapshot (revision recorded) under location. st (may be NULL)
 * receives what was archived (entries and file bytes), as far as it went on a failure. */
int ka_snapobj_save(const char *location, const char *id, const char *revision, const char *dir,
                    const ka_tree_opts_t *o, ka_tree_stats_t *st, char *err, size_t cap);

/* Restores sandbox id's snapshot under location into dir (empty). -ENOENT: none saved. st (may
 * be NULL) receives what was restored (entries and file bytes), as far as it went on a failure. */
int ka_snapobj_restore(const char *location, const char *id, const char *dir,
                       const ka_tree_opts_t *o, ka_tree_stats_t *st, char *err, size_t cap);

/* Deletes every object of sandbox id's snapshots under location (none: 0). */
int ka_snapobj_remove(const char *location, const char *id, const ka_tree_opts_t *o, char *err,
                      size_t cap);

#endif
