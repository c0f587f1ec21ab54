import sys

from pdwarden_localcluster.kubelet.main import main

sys.exit(main())
