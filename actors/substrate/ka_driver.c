/* ka_driver: dispatch through the class vtable (see ka_driver.h). */
#include "ka_driver.h"

#include <errno.h>
#include <stddef.h>

int ka_driver_start(ka_driver_t *d, const ka_sandbox_spec_t *spec, ka_sandbox_t **out)
{
    if (!d || !spec || !out)
        return -EINVAL;
    return d->ops->start(d, spec, out);
}

int ka_driver_stop(ka_driver_t *d, ka_sandbox_t **sb)
{
    if (!d || !sb || !*sb)
        return 0;
    return d->ops->stop(d, sb);
}

int ka_driver_halt(ka_driver_t *d, ka_sandbox_t *sb)
{
    if (!d || !sb)
        return -EINVAL;
    return d->ops->halt(d, sb);
}

const char *ka_driver_data_dir(ka_driver_t *d, ka_sandbox_t *sb)
{
    return d && sb ? d->ops->data_dir(d, sb) : NULL;
}

uint32_t ka_driver_owner(ka_driver_t *d, ka_sandbox_t *sb)
{
    return d && sb ? d->ops->owner(d, sb) : 0;
}

int ka_driver_stats(ka_driver_t *d, ka_sandbox_t *sb, ka_sandbox_stats_t *out)
{
    if (!d || !sb || !out)
        return -EINVAL;
    return d->ops->stats(d, sb, out);
}

int ka_driver_stats_id(ka_driver_t *d, const char *id, ka_sandbox_stats_t *out)
{
    if (!d || !id || !out)
        return -EINVAL;
    return d->ops->stats_id ? d->ops->stats_id(d, id, out) : -ENOTSUP;
}

int ka_driver_channel(ka_driver_t *d, ka_sandbox_t *sb)
{
    if (!d || !sb)
        return -EINVAL;
    return d->ops->channel(d, sb);
}

int ka_driver_kill(ka_driver_t *d, ka_sandbox_t *sb)
{
    if (!d || !sb)
        return -EINVAL;
    return d->ops->kill ? d->ops->kill(d, sb) : -ENOSYS;
}

int ka_driver_freeze(ka_driver_t *d, ka_sandbox_t *sb, bool frozen)
{
    if (!d || !sb)
        return -EINVAL;
    return d->ops->freeze ? d->ops->freeze(d, sb, frozen) : -ENOTSUP;
}

int ka_driver_fork(ka_driver_t *d, ka_sandbox_t *src, const char *id, uint64_t *bytes)
{
    *bytes = 0;
    if (!d || !src || !id)
        return -EINVAL;
    return d->ops->fork ? d->ops->fork(d, src, id, bytes) : -ENOTSUP;
}

int ka_driver_park(ka_driver_t *d, ka_sandbox_t **sb)
{
    if (!d || !sb || !*sb)
        return 0;
    return d->ops->park ? d->ops->park(d, sb) : d->ops->stop(d, sb);
}

bool ka_driver_kept(ka_driver_t *d, const char *id)
{
    return d && id && d->ops->kept && d->ops->kept(d, id);
}

int ka_driver_discard(ka_driver_t *d, const char *id)
{
    if (!d || !id)
        return -EINVAL;
    return d->ops->discard ? d->ops->discard(d, id) : 0;
}

size_t ka_driver_kept_ids(ka_driver_t *d, char (*ids)[KA_DRIVER_ID_LEN], size_t cap)
{
    return d && d->ops->kept_ids ? d->ops->kept_ids(d, ids, cap) : 0;
}

void ka_driver_destroy(ka_driver_t **d_p)
{
    if (!d_p || !*d_p)
        return;
    (*d_p)->ops->destroy(*d_p);
    *d_p = NULL;
}
