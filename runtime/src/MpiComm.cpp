//===- MpiComm.cpp - the MPI communication backend ------------------------===//
//
// Every collective is built from non-blocking MPI calls that are polled
// against a deadline (MOERT_COMM_TIMEOUT): a rank that crashed or stalls is
// noticed by the others, named in the message with the collective, and the
// collective fails (the tool then ends the job: abortJob, MPI_Abort). MPI
// errors are returned (MPI_ERRORS_RETURN on
// the communicator) and reported by name.
//
// all_to_all: each pair of ranks exchanges a small header (the collective's
//   number and kind, the row size, the counts) with Isend/Irecv, then the
//   rows; a header that does not match means the ranks run different
//   programs and is an error. A started exchange (allToAllVStart) returns
//   with the rows' sends and receives posted; its wait polls them. (How much
//   moves while the caller computes is up to the MPI library's progress:
//   shared-memory transports mostly progress inside MPI calls.)
// all_reduce: MPI_Iallreduce (bf16/f16 in f32), with the same kind of header
//   sent to every peer first, so a missing rank can be named.
// barrier: the header exchange alone.
//
//===----------------------------------------------------------------------===//

#include "CommBackends.h"

// The C API only (no MPI-2 C++ bindings, which need libmpi_cxx).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace moert::comm {
namespace {

constexpr int kHeaderTag = 0x6d6f; // "mo"
constexpr int kRowsTag = 0x6d70;

/// What a rank tells each peer when it enters a collective.
struct Header {
  int64_t seq;      ///< collectives so far on the sender, this one included
  int64_t kind;     ///< Kind
  int64_t rowBytes; ///< all_to_all: bytes per row; all_reduce: element count
  int64_t type;     ///< all_reduce: DType
};

std::string mpiError(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
    std::snprintf(text, sizeof(text), "MPI error %d", rc);
  int cls = 0;
  MPI_Error_class(rc, &cls);
  static const std::map<int, const char *> classes = {
      {MPI_ERR_BUFFER, "MPI_ERR_BUFFER"},
      {MPI_ERR_COUNT, "MPI_ERR_COUNT"},
      {MPI_ERR_TYPE, "MPI_ERR_TYPE"},
      {MPI_ERR_TAG, "MPI_ERR_TAG"},
      {MPI_ERR_COMM, "MPI_ERR_COMM"},
      {MPI_ERR_RANK, "MPI_ERR_RANK"},
      {MPI_ERR_REQUEST, "MPI_ERR_REQUEST"},
      {MPI_ERR_ROOT, "MPI_ERR_ROOT"},
      {MPI_ERR_OP, "MPI_ERR_OP"},
      {MPI_ERR_ARG, "MPI_ERR_ARG"},
      {MPI_ERR_TRUNCATE, "MPI_ERR_TRUNCATE"},
      {MPI_ERR_OTHER, "MPI_ERR_OTHER"},
      {MPI_ERR_INTERN, "MPI_ERR_INTERN"},
      {MPI_ERR_PENDING, "MPI_ERR_PENDING"},
      {MPI_ERR_IN_STATUS, "MPI_ERR_IN_STATUS"},
      {MPI_ERR_NO_MEM, "MPI_ERR_NO_MEM"}};
  auto it = classes.find(cls);
  std::string s = it != classes.end()
                      ? it->second
                      : "MPI error class " + std::to_string(cls);
  // Open MPI's strings start with the class name already.
  if (std::strncmp(text, s.c_str(), s.size()) == 0)
    return text;
  return s + ": " + text;
}

class MpiComm final : public Communicator {
public:
  explicit MpiComm(const LaunchEnv &env) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      int rc =
          MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      if (rc != MPI_SUCCESS)
        moert::fail("MPI_Init_thread failed: " + mpiError(rc));
      initializedHere = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup", "setup");
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    check(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank", "setup");
    check(MPI_Comm_size(comm, &size_), "MPI_Comm_size", "setup");
    // A torchrun-style environment, if any, must describe the same job.
    std::string problem;
    if (env.worldSize >= 0 && env.worldSize != size_)
      problem = "WORLD_SIZE=" + std::to_string(env.worldSize) +
                " disagrees with MPI: the launcher started " +
                std::to_string(size_) + " processes";
    else if (env.rank >= 0 && env.rank != rank_)
      problem = "RANK=" + std::to_string(env.rank) +
                " disagrees with MPI, which gives this process rank " +
                std::to_string(rank_);
    else if (const char *ompi = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
             ompi && env.localRank >= 0 && std::atoi(ompi) != env.localRank)
      problem = "LOCAL_RANK=" + std::to_string(env.localRank) +
                " disagrees with the MPI launcher's local rank " + ompi;
    // Every rank learns whether any rank's environment disagrees, after each
    // such rank has said why, and then every rank fails (the tool's
    // abortJob stops the job): no rank goes on alone, and none is killed
    // before its message is out.
    if (!problem.empty())
      say(problem);
    int bad = !problem.empty(), anyBad = bad;
    check(MPI_Allreduce(&bad, &anyBad, 1, MPI_INT, MPI_MAX, comm),
          "MPI_Allreduce", "setup");
    if (anyBad) {
      MPI_Comm_free(&comm);
      throw Error("rank " + std::to_string(rank_) + ": " +
                  (bad ? "the launch environment disagrees with MPI (see above)"
                       : "another rank's launch environment disagrees with "
                         "MPI"));
    }
    if (initializedHere)
      std::atexit(finalizeAtExit);
    self = this;
  }

  /// A group's communicator (split).
  explicit MpiComm(MPI_Comm group) : comm(group) {
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    check(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank", "setup");
    check(MPI_Comm_size(comm, &size_), "MPI_Comm_size", "setup");
    groups().push_back(this);
  }

  std::unique_ptr<Communicator> split(int color, int, int key,
                                      int size) override {
    std::lock_guard<std::mutex> lock(mu);
    MPI_Comm group = MPI_COMM_NULL;
    check(MPI_Comm_split(comm, color, key, &group), "MPI_Comm_split",
          "a group of " + std::to_string(size) + " ranks");
    auto made = std::make_unique<MpiComm>(group);
    if (made->size() != size || made->rank() != key)
      fail(1, "MPI_Comm_split made a group of " + std::to_string(made->size()) +
                  " ranks (rank " + std::to_string(made->rank()) + "), not " +
                  std::to_string(size) + " (rank " + std::to_string(key) + ")");
    return made;
  }

  const char *backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allToAllV(const void *send, int64_t sendRows, const int32_t *sendCounts,
                 int64_t slots, int64_t rowBytes, void *recv,
                 int64_t recvCapacity, int32_t *recvCounts, const char *what,
                 const RowLayout &layout) override {
    std::lock_guard<std::mutex> lock(mu);
    Rows rows(*this);
    startAllToAll(send, sendRows, sendCounts, slots, rowBytes, recv,
                  recvCapacity, recvCounts, what, layout, rows);
    wait(rows.reqs, rows.peers, rows.isRecv, rows.label, "rows");
  }

  std::unique_ptr<Pending> allToAllVStart(const void *send, int64_t sendRows,
                                          const int32_t *sendCounts,
                                          int64_t slots, int64_t rowBytes,
                                          void *recv, int64_t recvCapacity,
                                          int32_t *recvCounts, const char *what,
                                          const RowLayout &layout) override {
    std::lock_guard<std::mutex> lock(mu);
    auto rows = std::make_unique<Rows>(*this);
    startAllToAll(send, sendRows, sendCounts, slots, rowBytes, recv,
                  recvCapacity, recvCounts, what, layout, *rows);
    return rows;
  }

  /// The rows of an all_to_all in flight (non-blocking sends and receives).
  struct Rows final : Pending {
    explicit Rows(MpiComm &comm) : comm(comm) {}
    void wait() override {
      std::lock_guard<std::mutex> lock(comm.mu);
      comm.wait(reqs, peers, isRecv, label, "rows");
    }
    MpiComm &comm;
    std::string label;
    std::vector<MPI_Request> reqs;
    std::vector<int> peers;
    std::vector<bool> isRecv;
  };

  /// An all_to_all up to its rows: headers and counts exchanged (and
  /// checked), recvCounts written, own rows copied, zeros written, the rows'
  /// sends and receives posted into `rows`.
  void startAllToAll(const void *send, int64_t sendRows,
                     const int32_t *sendCounts, int64_t slots, int64_t rowBytes,
                     void *recv, int64_t recvCapacity, int32_t *recvCounts,
                     const char *what, const RowLayout &layout, Rows &rows) {
    std::string label = seq.enter(*this, Kind::AllToAll, what);
    rows.label = label;
    checkSendCounts(*this, label, sendRows, sendCounts, slots * size_);
    // 1. Headers and counts: [Header, counts for that peer (int64)].
    const int64_t words = kAllToAllHeaderWords + slots;
    std::vector<int64_t> out =
        allToAllHeaders(size_, seq.total, rowBytes, slots, layout, sendCounts);
    std::vector<int64_t> in(size_t(size_ * words));
    std::vector<MPI_Request> reqs;
    std::vector<int> peers;
    std::vector<bool> isRecv;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_)
        continue;
      reqs.emplace_back();
      check(MPI_Irecv(&in[size_t(p * words)], int(words), MPI_INT64_T, p,
                      kHeaderTag, comm, &reqs.back()),
            "MPI_Irecv", label);
      peers.push_back(p);
      isRecv.push_back(true);
    }
    for (int p = 0; p < size_; ++p) {
      if (p == rank_)
        continue;
      reqs.emplace_back();
      check(MPI_Isend(&out[size_t(p * words)], int(words), MPI_INT64_T, p,
                      kHeaderTag, comm, &reqs.back()),
            "MPI_Isend", label);
      peers.push_back(p);
      isRecv.push_back(false);
    }
    std::copy_n(&out[size_t(rank_ * words)], words, &in[size_t(rank_ * words)]);
    wait(reqs, peers, isRecv, label, "counts");
    // 2. Where the rows go and come from.
    readAllToAllHeaders(*this, label, in, seq.total, rowBytes, slots, layout,
                        sendCounts, recvCounts, recvCapacity);
    RowPlan plan = planRows(*this, label, sendCounts, recvCounts, slots, layout,
                            sendRows, recvCapacity);
    // 3. The rows, segment by segment (both sides of a pair list the same
    // segments), as rows of a contiguous type (counts stay small).
    MPI_Datatype row = rowType(rowBytes, label);
    reqs.clear();
    peers.clear();
    isRecv.clear();
    const char *src = static_cast<const char *>(send);
    char *dst = static_cast<char *>(recv);
    auto post = [&](bool receive, int p, RowSegment s) {
      for (int64_t done = 0; done < s.rows;) {
        int n = int(std::min<int64_t>(s.rows - done, INT_MAX));
        reqs.emplace_back();
        if (receive)
          check(MPI_Irecv(dst + (s.row + done) * rowBytes, n, row, p, kRowsTag,
                          comm, &reqs.back()),
                "MPI_Irecv", label);
        else
          check(MPI_Isend(src + (s.row + done) * rowBytes, n, row, p, kRowsTag,
                          comm, &reqs.back()),
                "MPI_Isend", label);
        peers.push_back(p);
        isRecv.push_back(receive);
        done += n;
      }
    };
    for (int p = 0; p < size_; ++p)
      if (p != rank_)
        for (RowSegment s : plan.recv[size_t(p)])
          post(/*receive=*/true, p, s);
    for (int p = 0; p < size_; ++p)
      if (p != rank_)
        for (RowSegment s : plan.send[size_t(p)])
          post(/*receive=*/false, p, s);
    for (auto [s, r] :
         zipped(plan.send[size_t(rank_)], plan.recv[size_t(rank_)]))
      std::memcpy(dst + r.row * rowBytes, src + s.row * rowBytes,
                  size_t(r.rows * rowBytes));
    for (RowSegment z : plan.zero)
      std::memset(dst + z.row * rowBytes, 0, size_t(z.rows * rowBytes));
    rows.reqs = std::move(reqs);
    rows.peers = std::move(peers);
    rows.isRecv = std::move(isRecv);
  }

  /// A sum in flight: headers and MPI_Iallreduce posted, finished by
  /// finishSum (blocking) or by the wait of a started sum.
  struct Sum final : Pending {
    explicit Sum(MpiComm &comm) : comm(comm) {}
    void wait() override {
      std::lock_guard<std::mutex> lock(comm.mu);
      comm.finishSum(*this);
    }
    MpiComm &comm;
    std::string label;
    uint64_t total = 0; ///< this rank's collective count at the start
    std::vector<Header> headers;
    std::vector<MPI_Request> reqs;
    std::vector<int> peers;
    std::vector<bool> isRecv;
    std::vector<float> wide; ///< bf16 / f16: summed in f32
    void *out = nullptr;
    DType type = DType::F32;
    int64_t count = 0;
  };

  void allReduceSum(const void *in, void *out, int64_t count,
                    DType type) override {
    std::lock_guard<std::mutex> lock(mu);
    Sum sum(*this);
    startSum(in, out, count, type, sum);
    finishSum(sum);
  }

  /// The sum runs in MPI's background (its progress: inside MPI calls)
  /// until the wait; the headers are checked there.
  std::unique_ptr<Pending> allReduceSumStart(const void *in, void *out,
                                             int64_t count,
                                             DType type) override {
    std::lock_guard<std::mutex> lock(mu);
    auto sum = std::make_unique<Sum>(*this);
    startSum(in, out, count, type, *sum);
    return sum;
  }

  void startSum(const void *in, void *out, int64_t count, DType type, Sum &s) {
    std::string what =
        std::string(name(type)) + ", " + std::to_string(count) + " values";
    s.label = seq.enter(*this, Kind::AllReduce, what.c_str());
    s.total = seq.total;
    s.out = out;
    s.type = type;
    s.count = count;
    postHeaders(Kind::AllReduce, count, int64_t(type), s.label, s.headers,
                s.reqs, s.peers, s.isRecv);
    void *buffer = out;
    MPI_Datatype mpiType;
    switch (type) {
    case DType::F32:
      mpiType = MPI_FLOAT;
      break;
    case DType::F64:
      mpiType = MPI_DOUBLE;
      break;
    case DType::I32:
      mpiType = MPI_INT32_T;
      break;
    case DType::I64:
      mpiType = MPI_INT64_T;
      break;
    default:
      mpiType = MPI_FLOAT;
      s.wide.resize(size_t(count));
      for (int64_t i = 0; i < count; ++i)
        s.wide[size_t(i)] = toFloat(in, type, i);
      buffer = s.wide.data();
      break;
    }
    if (s.wide.empty() && in != out)
      std::memcpy(out, in, size_t(count) * bytes(type));
    size_t eb = s.wide.empty() ? bytes(type) : sizeof(float);
    for (int64_t done = 0; done < count;) {
      int n = int(std::min<int64_t>(count - done, INT_MAX));
      s.reqs.emplace_back();
      check(MPI_Iallreduce(MPI_IN_PLACE,
                           static_cast<char *>(buffer) + done * eb, n, mpiType,
                           MPI_SUM, comm, &s.reqs.back()),
            "MPI_Iallreduce", s.label);
      s.peers.push_back(-1);
      s.isRecv.push_back(true);
      done += n;
    }
  }

  void finishSum(Sum &s) {
    wait(s.reqs, s.peers, s.isRecv, s.label, "values");
    for (int p = 0; p < size_; ++p)
      if (p != rank_)
        checkHeader(*this, s.label, p, &s.headers[size_t(p)].seq, s.total,
                    Kind::AllReduce);
    if (!s.wide.empty())
      for (int64_t i = 0; i < s.count; ++i)
        fromFloat(s.out, s.type, i, s.wide[size_t(i)]);
  }

  void barrier() override {
    std::lock_guard<std::mutex> lock(mu);
    std::string label = seq.enter(*this, Kind::Barrier, "");
    std::vector<Header> headers;
    std::vector<MPI_Request> reqs;
    std::vector<int> peers;
    std::vector<bool> isRecv;
    postHeaders(Kind::Barrier, 0, 0, label, headers, reqs, peers, isRecv);
    wait(reqs, peers, isRecv, label, "arrival");
    for (int p = 0; p < size_; ++p)
      if (p != rank_)
        checkHeader(*this, label, p, &headers[size_t(p)].seq, seq.total,
                    Kind::Barrier);
  }

  void abort(int code) override {
    // The whole job (MPI_Abort on a group's communicator may end only the
    // group).
    MPI_Abort(MPI_COMM_WORLD, code);
  }

private:
  /// `message` on stderr, this rank's, flushed (and stdout before it).
  void say(const std::string &message) const {
    std::fflush(stdout);
    std::fprintf(stderr, "moert: rank %d: %s\n", rank_, message.c_str());
    std::fflush(stderr);
  }

  static void finalizeAtExit() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
      return;
    // After a failed collective MPI_Finalize would wait for the rank that
    // failed (or requests that never complete): the job is aborted instead,
    // which also stops the other ranks.
    bool failed = self && !self->failure().empty();
    for (MpiComm *g : groups())
      failed |= !g->failure().empty();
    if (failed)
      MPI_Abort(MPI_COMM_WORLD, 2);
    if (self && self->comm != MPI_COMM_NULL) {
      for (auto &[bytes, type] : self->rowTypes)
        MPI_Type_free(&type);
      MPI_Comm_free(&self->comm);
    }
    MPI_Finalize();
  }

  void check(int rc, const char *call, const std::string &label) {
    if (rc == MPI_SUCCESS)
      return;
    fail(1, label + ": " + call + " failed: " + mpiError(rc));
  }

  MPI_Datatype rowType(int64_t rowBytes, const std::string &label) {
    auto it = rowTypes.find(rowBytes);
    if (it != rowTypes.end())
      return it->second;
    if (rowBytes > INT_MAX)
      fail(1, label + ": rows of " + std::to_string(rowBytes) +
                  " bytes are too large");
    MPI_Datatype t;
    check(MPI_Type_contiguous(int(rowBytes), MPI_BYTE, &t),
          "MPI_Type_contiguous", label);
    check(MPI_Type_commit(&t), "MPI_Type_commit", label);
    rowTypes[rowBytes] = t;
    return t;
  }

  /// Sends this rank's header to every peer and posts a receive for theirs.
  void postHeaders(Kind kind, int64_t a, int64_t b, const std::string &label,
                   std::vector<Header> &headers, std::vector<MPI_Request> &reqs,
                   std::vector<int> &peers, std::vector<bool> &isRecv) {
    headers.assign(size_t(size_) + 1, Header{});
    Header &mine = headers[size_t(size_)];
    mine = {int64_t(seq.total), int64_t(kind), a, b};
    for (int p = 0; p < size_; ++p) {
      if (p == rank_)
        continue;
      reqs.emplace_back();
      check(MPI_Irecv(&headers[size_t(p)], 4, MPI_INT64_T, p, kHeaderTag, comm,
                      &reqs.back()),
            "MPI_Irecv", label);
      peers.push_back(p);
      isRecv.push_back(true);
      reqs.emplace_back();
      check(MPI_Isend(&mine, 4, MPI_INT64_T, p, kHeaderTag, comm, &reqs.back()),
            "MPI_Isend", label);
      peers.push_back(p);
      isRecv.push_back(false);
    }
  }

  /// Polls the requests until all complete or the deadline passes; then
  /// names the ranks not heard from and fails the collective.
  void wait(std::vector<MPI_Request> &reqs, const std::vector<int> &peers,
            const std::vector<bool> &isRecv, const std::string &label,
            const char *phase) {
    if (reqs.empty())
      return;
    using clock = std::chrono::steady_clock;
    double timeout = timeoutSeconds();
    auto start = clock::now();
    auto deadline = start + std::chrono::duration_cast<clock::duration>(
                                std::chrono::duration<double>(timeout));
    int spins = 0;
    while (true) {
      int done = 0;
      int rc = MPI_Testall(int(reqs.size()), reqs.data(), &done,
                           MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS)
        fail(1, label + ": waiting for " + phase + " failed: " + mpiError(rc));
      if (done)
        return;
      if (clock::now() >= deadline)
        break;
      // Spin briefly (short exchanges), then sleep up to 1 ms between polls.
      if (++spins > 64)
        std::this_thread::sleep_for(
            std::chrono::microseconds(std::min(1000, 10 * (spins - 64))));
    }
    // Who has not answered? Receives first: a missing peer never sends.
    std::vector<int> missing, notReceiving;
    bool collective = false;
    for (size_t i = 0; i < reqs.size(); ++i) {
      int flag = 0;
      MPI_Request_get_status(reqs[i], &flag, MPI_STATUS_IGNORE);
      if (flag)
        continue;
      if (peers[i] < 0)
        collective = true;
      else if (isRecv[i])
        missing.push_back(peers[i]);
      else
        notReceiving.push_back(peers[i]);
    }
    auto list = [](std::vector<int> v) {
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
      std::string s = v.size() == 1 ? "rank " : "ranks ";
      for (size_t i = 0; i < v.size(); ++i)
        s += (i ? ", " : "") + std::to_string(v[i]);
      return s;
    };
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%g", timeout);
    std::string who =
        !missing.empty()        ? "waiting for " + list(missing)
        : !notReceiving.empty() ? list(notReceiving) + " did not take its data"
        : collective ? "every rank arrived but MPI did not complete the "
                       "reduction"
                     : "waiting";
    fail(2, label + ": timed out after " + seconds +
                " s (MOERT_COMM_TIMEOUT) " + who + " (" + phase +
                "): that rank failed or stalls; aborting the job");
  }

  MPI_Comm comm = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  bool initializedHere = false;
  std::mutex mu;
  Sequence seq;
  std::map<int64_t, MPI_Datatype> rowTypes;
  static MpiComm *self;
  /// The groups' communicators (never destroyed).
  static std::vector<MpiComm *> &groups() {
    static std::vector<MpiComm *> *all = new std::vector<MpiComm *>();
    return *all;
  }
};

MpiComm *MpiComm::self = nullptr;

} // namespace

std::unique_ptr<Communicator> createMpiCommunicator(const LaunchEnv &env) {
  return std::make_unique<MpiComm>(env);
}

void abortMpiJob(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized)
    MPI_Abort(MPI_COMM_WORLD, code);
}

} // namespace moert::comm
