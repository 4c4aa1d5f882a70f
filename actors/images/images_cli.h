/*
 * images_cli: the `image` command of the node binary, working on the local store.
 *
 *   image import FILE|DIR [--name NAME]     OCI layout (dir or tar) or docker-archive tar
 *   image build --rootfs DIR [--name NAME]  prints NAME@sha256:<manifest hex>
 *   image list
 *   image rm REF
 *   image pull HOST/REPO@sha256:<hex> [--mirror REGISTRY=URL]...
 *   image rootfs REF                        prepares and prints the overlayfs lower directory
 *   image verify REF                        re-hashes every blob of REF
 */
#ifndef KA_IMAGES_CLI_H
#define KA_IMAGES_CLI_H

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Runs one image command on the store in <state_dir>/images. argv is as for main(): argv[0]
 * names the command ("image"; it is not interpreted), argv[1] is the subcommand. Results go to
 * stdout, errors to stderr. Returns the exit code: 0 success, 1 failure, 2 usage error.
 */
int ka_images_cli(const char *state_dir, int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif /* KA_IMAGES_CLI_H */
