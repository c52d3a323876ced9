// Files from and for the user, handled so that bad paths give one clear error instead of a hang,
// a crash or lost data (issue 17, item 4):
//   * read_small_file: configs, id lists, routing logs, tokenizer files, index JSON. Opens with
//     O_NONBLOCK (a FIFO never blocks the open), refuses anything but a regular file (a
//     directory, FIFO, device or socket) and files above a size limit, and reports read errors.
//   * OutputPath: a file a command will write (logits -o, --stats-json, --record-routing, --dump
//     DIR/dump.safetensors), checked when the command starts, before the model is loaded: the
//     directory exists and is writable, the path is not a directory, device, FIFO or socket, and
//     it is none of the files the command reads (compared by st_dev/st_ino, so a symlink or hard
//     link to a shard is caught too). An existing regular file is replaced (atomically: written
//     beside it and renamed), which is what -o means.
//   * write_file_atomic: small outputs written to PATH.partial and renamed into place.
// Not here: safetensors I/O (storage/safetensors.h), the expert reader's O_DIRECT files.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

// One file's identity (device, inode), for "is this output one of my inputs?".
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileId&) const = default;
};

// The identity of an existing path (following symlinks); false when it does not exist.
bool file_id(const std::filesystem::path& p, FileId* out);

// Whole contents of a regular file of at most max_bytes. `what` names the file in errors, e.g.
// "--ids ids.json" or "config.json": "WHAT: is a directory, expected a file".
std::string read_small_file(const std::filesystem::path& p, const std::string& what,
                            uint64_t max_bytes = 256ull << 20);

// An output file, checked up front. `flag` names it in errors ("-o", "--stats-json").
class OutputPath {
 public:
  OutputPath() = default;
  // Throws strata::Error naming the flag and the path when the target cannot be written or must
  // not be replaced (see the file comment). `inputs` are the files the command reads.
  OutputPath(std::string flag, const std::filesystem::path& path,
             const std::vector<FileId>& inputs);
  bool empty() const { return path_.empty(); }
  const std::filesystem::path& path() const { return path_; }
  const std::string& flag() const { return flag_; }

 private:
  std::string flag_;
  std::filesystem::path path_;
};

// The identities of every regular file directly inside `dir` (a model directory: config, index,
// shards, tokenizer), plus `extra` files; missing ones are skipped.
std::vector<FileId> input_file_ids(const std::filesystem::path& dir,
                                   const std::vector<std::filesystem::path>& extra = {});

// Writes `data` to PATH.partial and renames it to PATH. Throws strata::Error naming `what`.
void write_file_atomic(const std::filesystem::path& p, std::string_view data,
                       const std::string& what);

// Opens PATH for writing a new file beside the target (O_CREAT | O_TRUNC, never following a
// symlink and never blocking on a FIFO); refuses anything that is not a regular file. Returns the
// fd. Used for the ".partial" files of the atomic writers.
int open_partial_for_write(const std::filesystem::path& p, const std::string& what);

}  // namespace strata
