// check_owner: the one error for an object used through a context, channel or host that did
// not make it (verbs.h). The kernel refuses such a handle too: uverbs looks a handle up in the
// calling file's table only (uobj_get_type: -EINVAL for a handle it does not hold).
#include <cerrno>

#include "rdmalab/verbs.h"

namespace rdmalab {

namespace {

std::string where_text(const Owner& o) {
  if (o.label.empty()) return "host " + o.host;
  return o.label + " on host " + o.host;
}

}  // namespace

Error foreign_object_error(const std::string& verb, const std::string& kind,
                           const std::string& label, const Owner& of, const Owner& where) {
  std::string detail =
      kind + " " + label + " is of " + where_text(of) + ", not of " + where_text(where);
  if (of.lab != where.lab && of.lab != nullptr && where.lab != nullptr &&
      where_text(of) == where_text(where)) {
    detail += " (another lab)";
  }
  return {verb, EINVAL, detail};
}

void check_owner(const Owner& where, const Object& obj, const std::string& verb,
                 const std::string& kind) {
  const Owner of = obj.owner();
  bool same = true;
  if (where.id != 0) {
    same = of.id == where.id && of.lab == where.lab;
  } else {
    same = (where.host.empty() || of.host == where.host) &&
           (where.lab == nullptr || of.lab == nullptr || of.lab == where.lab);
  }
  if (!same) throw foreign_object_error(verb, kind, obj.label(), of, where);
}

}  // namespace rdmalab
