/* commands: the subcommands of the one `strata` binary. Each lives in its own file and returns the
 * process exit status (0 success, 1 runtime failure, 2 usage error). */
#ifndef STRATA_COMMANDS_H
#define STRATA_COMMANDS_H

/* Each subsystem adds its line here and its entry in serving/main.c. */
int cmd_generate(int argc, char **argv); /* serving/generate_cmd.c */
int cmd_node(int argc, char **argv);     /* transport/node_cmd.c: a fabric node */
int cmd_convert(int argc, char **argv);  /* serving/engine/convert_cmd.c */
int cmd_inspect(int argc, char **argv);  /* serving/engine/inspect_cmd.c: what a GGUF holds */
int cmd_serve(int argc, char **argv);    /* serving/api/serve_cmd.c: the OpenAI-compatible server */
int cmd_update(int argc, char **argv);   /* os/update_cmd.c: write the inactive boot slot */

#endif
