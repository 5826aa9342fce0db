/* schema.h - the config schema, exported for editors and the manual.
 *
 * `mgc schema --json` prints a JSON Schema (draft 2020-12) that editors use to
 * validate and complete model YAML (docs/mgc-config.schema.json);
 * `mgc schema --markdown` prints the key reference of docs/model-yaml.md.
 * Both come from the one table in config.h, and a test keeps the committed
 * copies identical to what the binary prints. */
#ifndef MGC_SCHEMA_H
#define MGC_SCHEMA_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

void mgc_schema_print_json(FILE *out);
void mgc_schema_print_markdown(FILE *out);

#ifdef __cplusplus
}
#endif
#endif

#ifndef MGC_SCHEMA_CONFIG_DUMP
#define MGC_SCHEMA_CONFIG_DUMP
#include "config.h"
#include "json.h"
#ifdef __cplusplus
extern "C" {
#endif
/* The resolved configuration (defaults and derived values filled in), every
 * key in schema order.  As YAML, keys the user did not write appear commented
 * out and marked `# default` or `# derived`, so the text reads back as the
 * same config; as JSON, an object of sections written under `key`. */
void mgc_config_print_yaml(const mgc_config *c, FILE *out);
void mgc_config_print_json(const mgc_config *c, mgc_json *j, const char *key);
#ifdef __cplusplus
}
#endif
#endif
