/* data_cmd.h - the `mgc data` subcommand (writer side of data/).
 *
 *   mgc data build OUTPUT_PREFIX TEXT_FILE... [--append-eod] [--split file|blank|line]
 *   mgc data synthetic OUTPUT_PREFIX [--documents N] [--seed S]
 *   mgc data info PREFIX
 *
 * argv holds the words after "data" (argv[0] is the action).  Returns the
 * exit status: 0 ok, 1 an input or output file has errors, 2 bad usage.
 * docs/data.md is the manual. */
#ifndef MGC_DATA_CMD_H
#define MGC_DATA_CMD_H

#ifdef __cplusplus
extern "C" {
#endif

int mgc_cmd_data(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif
