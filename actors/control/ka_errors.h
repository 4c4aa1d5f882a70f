/*
 * ka_errors: the one error model. Inside the node an error is a negative errno; at the edges
 * (gRPC status, MCP isError result, metrics labels) it becomes a gRPC status code (ka_code_t)
 * and its name through ONE table (ka_errors.c). Every gRPC code has a canonical errno, so
 * code -> errno -> code is exact.
 */
#ifndef KA_ERRORS_H
#define KA_ERRORS_H

/* The gRPC status code of err (0 -> KA_OK; an errno not in the table -> KA_INTERNAL). */
int ka_err_code(int err);
/* The canonical negative errno of a gRPC status code (KA_OK -> 0; unknown -> -EPROTO). */
int ka_err_of_code(int code);
/* A status code's name ("INVALID_ARGUMENT"); "UNKNOWN" outside the table. Static. */
const char *ka_code_name(int code);
/* ka_code_name(ka_err_code(err)). */
const char *ka_err_name(int err);
/* err's canonical errno: ka_err_of_code(ka_err_code(err)) (the same code, one errno per code). */
int ka_err_canonical(int err);
/* The canonical errno of a guest operation's failure err: an errno of the sandbox's system
 * calls (EACCES is a denied permission there, not a missing identity), or the node's own in
 * sending it. Its own rows in ka_errors.c; an errno not in them -> INTERNAL's. */
int ka_err_of_guest(int err);

#endif
